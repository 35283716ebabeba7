"""A realistic, deterministic recorded run for tests, benchmarks and screenshots of the dashboard.

`make_run(path, steps=...)` writes a complete run folder (config.toml, run.json, metrics.jsonl with
start / loss_impl_switch / finish events, per-reward-function metrics, per-phase memory, time and
valid-token shares, and completions.jsonl). Fixed seed and fixed timestamps: the same arguments give
byte-identical files, so snapshot tests stay stable. `LiveWriter` appends the same kind of records at N Hz to a run
folder from a background thread, to exercise the dashboard's live path.

No torch, no Textual: this only writes files in the schema of `grpo_tui.runs.metrics`.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_tui.runs.metrics import (
    PHASES,
    SCHEMA_VERSION,
    STEP_TIME_KEY,
    TOKEN_PHASES,
    last_step,
    phase_time_key,
    valid_share_key,
)

# Fixed wall-clock origin of a recorded run (2026-01-01 00:00:00 UTC) so files are reproducible.
T0 = 1767225600.0
# Seconds between logged steps in the recorded stream.
STEP_SECONDS = 0.5
REWARD_FUNCS = ("addition_partial", "format")
PROMPTS = ("12+7=", "33+48=", "5+90=", "61+14=")


@dataclass
class DemoRun:
    """What `make_run` wrote, for tests to assert against."""

    path: Path
    steps: int
    switch_step: int | None
    pids: tuple[int, ...]


def _fmt(value: float) -> float:
    # Round like a logger would print them, keeping files compact and stable across platforms.
    return float(f"{value:.6g}")


def step_record(
    step: int,
    rng: random.Random,
    *,
    loss_impl: str = "chunked",
    t: float | None = None,
    n_gpus: int = 1,
    cuda: bool = True,
) -> dict[str, Any]:
    """One step record shaped like the trainer's: TRL's metric names plus `memory` with phases."""
    progress = 1.0 - math.exp(-step / 300.0)
    funcs = {
        name: min(1.0, max(0.0, 0.15 + 0.6 * progress * (0.8 + 0.2 * i) + rng.gauss(0, 0.04)))
        for i, name in enumerate(REWARD_FUNCS)
    }
    reward = sum(funcs.values()) / len(funcs)
    base = 2100.0 if loss_impl == "chunked" else 5200.0
    phases = {
        "generation": base * 0.7 + rng.uniform(0, 30),
        "scoring": base * 0.8 + rng.uniform(0, 30),
        "loss": base + rng.uniform(0, 40),
        "optimizer": base * 0.9 + rng.uniform(0, 30),
    }
    peak = max(phases.values())
    record: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "time": round(t if t is not None else T0 + 5.0 + step * STEP_SECONDS, 3),
        "step": step,
        "epoch": _fmt(step / 1000.0),
        "loss": _fmt(rng.gauss(0.0, 0.02)),
        "grad_norm": _fmt(abs(rng.gauss(0.3, 0.1))),
        "learning_rate": 3e-4,
        "reward": _fmt(reward),
        "reward_std": _fmt(0.25 * (1 - 0.5 * progress) + rng.uniform(0, 0.03)),
        "frac_reward_zero_std": _fmt(min(1.0, max(0.0, 0.1 + rng.gauss(0, 0.05)))),
        "kl": _fmt(0.002 * progress + abs(rng.gauss(0, 0.0005))),
        "entropy": _fmt(1.2 - 0.5 * progress + rng.gauss(0, 0.02)),
        "clip_ratio/low_mean": _fmt(abs(rng.gauss(0, 0.002))),
        "clip_ratio/high_mean": _fmt(abs(rng.gauss(0, 0.002))),
        "clip_ratio/region_mean": _fmt(abs(rng.gauss(0.004, 0.002))),
        "completions/mean_length": _fmt(3.5 + rng.gauss(0, 0.2)),
        "completions/min_length": 1.0,
        "completions/max_length": 4.0,
        "completions/clipped_ratio": _fmt(min(1.0, abs(rng.gauss(0.05, 0.02)))),
        "num_tokens": float(step * 32 * 12),
        "step_time": _fmt(STEP_SECONDS * (0.9 + 0.2 * rng.random())),
        "loss_impl": loss_impl,
    }
    # Per-phase seconds derived from step_time, not drawn from rng: the other values stay as they were.
    step_s = record["step_time"] * 1.1
    shares = {"generation": 0.55, "scoring": 0.12, "loss": 0.22 if loss_impl == "chunked" else 0.18, "optimizer": 0.06}
    record.update({phase_time_key(p): _fmt(step_s * shares[p]) for p in PHASES})
    record[STEP_TIME_KEY] = _fmt(step_s)
    # Valid-token shares, also not drawn from rng: generation decodes finished rows until the longest one
    # ends; scoring and loss trim their length-grouped slices, so only a little padding is left.
    wobble = 0.03 * math.sin(step / 7.0)
    valid = {"generation": 0.62 + wobble, "scoring": 0.91 + wobble / 3, "loss": 0.93 + wobble / 3}
    record.update({valid_share_key(p): round(valid[p], 3) for p in TOKEN_PHASES})
    for name, value in funcs.items():
        record[f"rewards/{name}/mean"] = _fmt(value)
        record[f"rewards/{name}/std"] = _fmt(0.3 * (1 - 0.5 * progress))
    gpus = (
        [
            {"index": i, "allocated_mib": _fmt(base * 0.5), "peak_mib": _fmt(peak), "reserved_mib": _fmt(peak * 1.1)}
            for i in range(n_gpus)
        ]
        if cuda
        else []
    )
    record["memory"] = {
        "device": "cuda" if cuda else "cpu",
        "gpus": gpus,
        "rss_mib": _fmt(900 + rng.uniform(0, 5)),
        "phases": {p: _fmt(phases[p]) for p in PHASES},
    }
    return record


def completion_records(step: int, rng: random.Random, per_step: int = 8) -> list[dict[str, Any]]:
    """Completions for one step: `per_step` samples over two prompt groups, with rewards and advantage."""
    out = []
    groups = (PROMPTS[step % len(PROMPTS)], PROMPTS[(step + 1) % len(PROMPTS)])
    for i in range(per_step):
        prompt = groups[i * len(groups) // per_step]
        rewards = {name: _fmt(rng.choice((0.0, 0.5, 1.0))) for name in REWARD_FUNCS}
        out.append(
            {
                "step": step,
                "prompt": prompt,
                "completion": str(rng.randint(0, 120)),
                "rewards": rewards,
                "advantage": _fmt(rng.gauss(0, 1)),
            }
        )
    return out


def _write_lines(path: Path, records: list[dict[str, Any]], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def write_config(path: Path, preset: str = "tiny-cpu", max_steps: int = 100, loss_impl: str = "chunked") -> None:
    """A minimal resolved config.toml (the sections the dashboard reads)."""
    text = (
        f'name = "{preset}"\n\n[grpo]\nmax_steps = {max_steps}\nnum_generations = 8\n\n'
        f'[loss]\nimpl = "{loss_impl}"\n\n[rewards]\nfunctions = '
        + "["
        + ", ".join(f'{{ name = "{n}", weight = 1.0 }}' for n in REWARD_FUNCS)
        + "]\n"
    )
    (path / "config.toml").write_text(text, encoding="utf-8")


def make_run(
    path: str | Path,
    steps: int = 200,
    *,
    max_steps: int | None = None,
    switch_step: int | None = None,
    finished: bool = True,
    status: str | None = None,
    pid: int = 424242,
    n_gpus: int = 1,
    cuda: bool = True,
    loss_impl: str = "chunked",
    preset: str = "tiny-cpu",
    seed: int = 0,
    completions: bool = True,
    truncate_last: bool = False,
    pid_started: float = T0,
) -> DemoRun:
    """Write a deterministic run folder with `steps` logged steps.

    Args:
        path: The run folder (created).
        steps: Logged steps to write.
        max_steps: `[grpo] max_steps` in config.toml (defaults to `steps`).
        switch_step: Step at which a loss_impl_switch event flips chunked <-> naive (None: no switch).
        finished: Whether to end with a finish event.
        status: run.json state (defaults to "finished" or "running").
        pid: Process id recorded in run.json and the start events (one per rank, pid + rank).
        n_gpus: Ranks / local GPUs.
        cuda: False writes CPU-style memory (no gpus, RSS only).
        loss_impl: Implementation at the start.
        preset: Preset name.
        seed: Random seed of the values.
        completions: Also write completions.jsonl.
        truncate_last: Leave half a record at the end of metrics.jsonl (a writer mid-line).
        pid_started: The create time recorded for `pid` in run.json (liveness checks compare it).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    max_steps = max_steps if max_steps is not None else steps
    write_config(root, preset, max_steps, loss_impl)
    pids = tuple(pid + r for r in range(n_gpus))
    # As the trainer writes it: one start event listing every rank (pid -> device for the GPU panel).
    ranks = [
        {"rank": r, "local_rank": r, "pid": p, "device": f"cuda:{r}" if cuda else "cpu"} for r, p in enumerate(pids)
    ]
    records: list[dict[str, Any]] = [
        {
            "v": SCHEMA_VERSION,
            "time": T0 + 1.0,
            "event": "start",
            "preset": preset,
            "run": root.name,
            "ranks": ranks,
            "num_processes": n_gpus,
            "loss_impl": loss_impl,
            "max_steps": max_steps,
        }
    ]
    comp: list[dict[str, Any]] = []
    impl = loss_impl
    for step in range(1, steps + 1):
        if switch_step is not None and step == switch_step:
            new = "naive" if impl == "chunked" else "chunked"
            records.append(
                {
                    "v": SCHEMA_VERSION,
                    "time": round(T0 + 4.9 + step * STEP_SECONDS, 3),
                    "event": "loss_impl_switch",
                    "step": step,
                    "from": impl,
                    "to": new,
                }
            )
            impl = new
        records.append(step_record(step, rng, loss_impl=impl, n_gpus=n_gpus, cuda=cuda))
        if completions:
            comp.extend(completion_records(step, rng))
    if finished:
        records.append(
            {
                "v": SCHEMA_VERSION,
                "time": round(T0 + 6.0 + steps * STEP_SECONDS, 3),
                "event": "finish",
                "step": steps,
                "stopped": False,
            }
        )
    _write_lines(root / "metrics.jsonl", records)
    if truncate_last:
        with open(root / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(step_record(steps + 1, rng, loss_impl=impl))[:80])
    if completions:
        _write_lines(root / "completions.jsonl", comp)
    state = status or ("finished" if finished else "running")
    run_json = {
        "preset": preset,
        "status": state,
        "created": T0,
        "pid": pid,
        "pid_started": pid_started,
        "started": T0,
        "child_pid": pid,
        "child_started": pid_started,
        "pgid": pid,
        "exit_code": 0 if state in ("finished", "stopped") else None,
    }
    (root / "run.json").write_text(json.dumps(run_json, indent=1), encoding="utf-8")
    return DemoRun(root, steps, switch_step, pids)


@dataclass
class LiveWriter:
    """Appends realistic step records (and completions) to a run folder at `hz` from a thread.

    Starts after the last step already in the folder; timestamps are real time. Use as a context
    manager or call start()/stop().
    """

    path: Path
    hz: float = 2.0
    start_step: int = 1
    loss_impl: str = "chunked"
    seed: int = 1
    steps_written: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> LiveWriter:
        self._thread = threading.Thread(target=self._run, name="demo-live-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LiveWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        rng = random.Random(self.seed)
        step = self.start_step
        metrics, completions = Path(self.path) / "metrics.jsonl", Path(self.path) / "completions.jsonl"
        while not self._stop.wait(1.0 / self.hz):
            _write_lines(metrics, [step_record(step, rng, loss_impl=self.loss_impl, t=time.time())], mode="a")
            _write_lines(completions, completion_records(step, rng), mode="a")
            self.steps_written += 1
            step += 1


def main(argv: list[str] | None = None) -> int:
    """`python -m grpo_tui.tools.demo make RUN_DIR [--steps N] [--switch-step S] [--running]` writes a recorded run;
    `python -m grpo_tui.tools.demo live RUN_DIR [--hz H] [--seconds T]` then appends steps to it like a live trainer."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m grpo_tui.tools.demo", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="write a deterministic recorded run folder")
    make.add_argument("run_dir", type=Path)
    make.add_argument("--steps", type=int, default=200)
    make.add_argument("--max-steps", type=int, default=None)
    make.add_argument("--switch-step", type=int, default=None)
    make.add_argument("--running", action="store_true", help="no finish event; run.json says running")
    live = sub.add_parser("live", help="append step records at --hz until --seconds pass (or Ctrl-C)")
    live.add_argument("run_dir", type=Path)
    live.add_argument("--hz", type=float, default=2.0)
    live.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args(argv)
    if args.command == "make":
        run = make_run(
            args.run_dir,
            args.steps,
            max_steps=args.max_steps,
            switch_step=args.switch_step,
            finished=not args.running,
            completions=args.steps <= 20_000,
        )
        print(run.path)
        return 0
    last = last_step(Path(args.run_dir) / "metrics.jsonl") or 0  # from the file's tail only
    writer = LiveWriter(Path(args.run_dir), hz=args.hz, start_step=last + 1).start()
    try:
        writer._stop.wait(args.seconds)
    except KeyboardInterrupt:
        pass
    writer.stop()
    print(f"appended {writer.steps_written} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
