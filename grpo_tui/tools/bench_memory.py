"""End-to-end memory benchmarks through the real runner: `grpo-tui bench memory`, and the trials that
`grpo-tui max-batch` (`tools.max_batch`) and `tune` run.

Each trial is a fresh `grpo-tui run PRESET --headless` subprocess (so allocator state never leaks
between trials) with `--set` overrides for the batch and the loss implementation; the numbers come
from the run's own metrics stream (per-phase peaks, step time) and its `oom` event. With `--lengths realistic`
each trial's completions end at realistic lengths ($GRPO_TUI_COMPLETION_LENGTHS, `tasks.workload`) instead of
running to `grpo.max_completion_length`, as an untrained model's do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from grpo_tui.config.cli_args import add_lengths_option, add_set_option
from grpo_tui.config.schema import LOSS_IMPLS
from grpo_tui.runs.metrics import PHASES, read_records, step_records
from grpo_tui.tasks.workload import LENGTHS_ENV
from grpo_tui.train.phase_memory import MEMORY_CAP_ENV

MIB_PER_GIB = 1024.0


@dataclass
class Trial:
    """One short run of one preset at one batch size and one loss implementation."""

    impl: str
    batch: int
    ok: bool
    peak_gib: float | None = None
    phases_gib: dict[str, float] = field(default_factory=dict)
    step_s: float | None = None
    oom_phase: str | None = None
    reason: str = ""
    run_dir: str = ""
    wall_s: float = 0.0


class TrialRun(NamedTuple):
    """`run_trial`'s answer: the trial, and its run's step records for a caller that measures more
    (read once with the trial's own summary; empty when no run folder appeared)."""

    trial: Trial
    steps: list[dict[str, Any]]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 8,16,32") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 8,16,32")
    return values


def _impl_list(text: str) -> list[str]:
    impls = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in impls if v not in LOSS_IMPLS]
    if bad or not impls:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed implementations are {', '.join(LOSS_IMPLS)}")
    return impls


def _summarise(
    records: list[dict[str, Any]],
) -> tuple[dict[str, float], float | None, float | None, dict[str, Any] | None]:
    """Per-phase peaks (max over steps, GiB), whole-step peak, median step time and the oom event."""
    steps = step_records(records)
    oom = next((r for r in records if r.get("event") == "oom"), None)
    phases: dict[str, float] = {}
    for record in steps:
        for name, mib in ((record.get("memory") or {}).get("phases") or {}).items():
            if isinstance(mib, (int, float)):
                phases[name] = max(phases.get(name, 0.0), mib / MIB_PER_GIB)
    peaks = [
        gpu.get("peak_mib", 0.0) / MIB_PER_GIB
        for record in steps
        for gpu in (record.get("memory") or {}).get("gpus") or []
    ]
    peak = max(peaks + list(phases.values()), default=None)
    times = [r["step_time"] for r in steps if isinstance(r.get("step_time"), (int, float))]
    # The first step carries compilation and allocator warm-up: leave it out when there are more.
    step_s = statistics.median(times[1:] or times) if times else None
    return phases, peak, step_s, oom


def run_trial(
    preset: str,
    impl: str,
    batch: int,
    *,
    steps: int,
    runs_dir: Path,
    extra_sets: list[str],
    memory_cap_gib: float | None = None,
    timeout_s: float = 1800.0,
    lengths: str = "cap",
) -> TrialRun:
    """Run PRESET for `steps` steps at per-device batch `batch` with loss.impl `impl`, in a fresh process, its
    completion lengths forced as `lengths` says (`tasks.workload`)."""
    argv = [
        sys.executable,
        "-m",
        "grpo_tui.cli",
        "run",
        preset,
        "--headless",
        "--runs-dir",
        str(runs_dir),
    ]
    # The user's overrides first: the trial's own impl, batch and length come last, so they win (a --set
    # grpo.per_device_batch_size given to tune or max-batch once pinned every trial to that batch).
    for item in [*extra_sets, f"loss.impl={impl}", f"grpo.per_device_batch_size={batch}", f"grpo.max_steps={steps}"]:
        argv += ["--set", item]
    argv += ["--set", "logging.save_steps=0"]
    env = {**os.environ, LENGTHS_ENV: lengths}  # set even for `cap`: the flag wins over the caller's environment
    if memory_cap_gib is not None:
        env[MEMORY_CAP_ENV] = str(memory_cap_gib)
    before = {p.name for p in runs_dir.iterdir()} if runs_dir.exists() else set()
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        code, tail = proc.returncode, (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
    except subprocess.TimeoutExpired:
        code, tail = -1, [f"timed out after {timeout_s:.0f} s"]
    wall = time.perf_counter() - start
    new = sorted(p for p in runs_dir.iterdir() if p.name not in before) if runs_dir.exists() else []
    run_dir = new[-1] if new else None
    trial = Trial(impl=impl, batch=batch, ok=code == 0, reason="" if code == 0 else tail[0], wall_s=round(wall, 1))
    records: list[dict[str, Any]] = []
    if run_dir is not None:
        trial.run_dir = str(run_dir)
        records = read_records(run_dir / "metrics.jsonl")
        phases, peak, step_s, oom = _summarise(records)
        trial.phases_gib = {k: round(v, 3) for k, v in phases.items()}
        trial.peak_gib = None if peak is None else round(peak, 3)
        trial.step_s = None if step_s is None else round(step_s, 4)
        if oom is not None:
            trial.ok = False
            trial.oom_phase = str(oom.get("phase"))
    return TrialRun(trial, step_records(records))


def environment_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"
    except Exception as exc:  # the benchmark must still write its results
        info["torch"] = f"unavailable: {exc}"
    for name in ("transformers", "trl", "triton", "accelerate", "peft"):
        try:
            info[name] = __import__(name).__version__
        except Exception:
            info[name] = None
    return info


def _table(trials: list[Trial], lengths: str) -> str:
    head = "| impl | batch | peak GiB | " + " | ".join(f"{p} GiB" for p in PHASES) + " | step s | status |"
    rows = [head, "|" + "---|" * (len(PHASES) + 5)]
    for t in trials:
        cells = [t.impl, str(t.batch), fmt_gib(t.peak_gib)] + [fmt_gib(t.phases_gib.get(p)) for p in PHASES]
        cells += [fmt_gib(t.step_s), "ok" if t.ok else f"OOM in {t.oom_phase}" if t.oom_phase else "failed"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([*rows, "", lengths_line(lengths)])


def lengths_line(lengths: str) -> str:
    """What the trials' completion lengths were, under a results table."""
    how = "each to its own EOS or the cap" if lengths == "cap" else "forced to seeded realistic lengths"
    return f"completion lengths: {lengths} ({how})"


def fmt_gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def plot_memory(trials: list[Trial], path: Path, title: str) -> bool:
    """Peak memory vs batch, one line per impl (the seed's figure). Returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    # Distinct markers and dashes: implementations with equal peaks would otherwise hide each other.
    styles = {"chunked": ("o", "-", 7), "naive": ("s", "-", 6), "trl": ("x", "--", 9)}
    for impl in sorted({t.impl for t in trials}):
        pts = sorted((t.batch, t.peak_gib) for t in trials if t.impl == impl and t.ok and t.peak_gib)
        marker, dash, size = styles.get(impl, ("o", "-", 6))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls=dash, ms=size, label=impl)
        for t in trials:
            if t.impl == impl and not t.ok:
                ax.axvline(t.batch, ls=":", lw=0.8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("per-device batch (completions)")
    ax.set_ylabel("whole-step peak allocated (GiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("preset", help="preset name or path to a .toml")
    parser.add_argument("--impl", type=_impl_list, default=list(LOSS_IMPLS), help="e.g. chunked,naive,trl")
    add_set_option(parser, dest="sets")  # applied to every trial
    parser.add_argument("--steps", type=int, default=2, help="steps per trial (default 2)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for JSON/markdown/PNG")
    parser.add_argument("--runs-dir", type=Path, default=None, help="where trial runs go (default OUT/runs)")
    add_lengths_option(parser)
    return parser


def write_report(out: Path, stem: str, payload: dict[str, Any], table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{stem}.md").write_text(table + "\n")


def main(argv: list[str] | None = None) -> int:
    """`grpo-tui bench memory PRESET --batch 8,16,32 --impl chunked,naive,trl`."""
    parser = common_parser("grpo-tui bench memory", "Peak memory per phase vs batch size, per loss implementation.")
    parser.add_argument("--batch", type=_int_list, default=[8, 16, 32, 64, 128], help="per-device batches")
    args = parser.parse_args(argv)
    checked_or_exit(parser, args.preset, args.sets)
    runs_dir = (args.runs_dir or args.out / "runs").resolve()
    command = "grpo-tui bench memory " + shlex.join(argv if argv is not None else sys.argv[1:])
    environment = environment_info()
    trials: list[Trial] = []
    for batch in args.batch:
        for impl in args.impl:
            trial = run_trial(
                args.preset,
                impl,
                batch,
                steps=args.steps,
                runs_dir=runs_dir,
                extra_sets=args.sets,
                lengths=args.lengths,
            ).trial
            trials.append(trial)
            print(
                f"{impl:8s} batch {batch:4d}: peak {fmt_gib(trial.peak_gib)} GiB, step {fmt_gib(trial.step_s)} s"
                f"{'' if trial.ok else ' — ' + (trial.oom_phase and 'OOM in ' + trial.oom_phase or trial.reason)}",
                flush=True,
            )
            # Written after every trial: a long sweep cut short still leaves its results.
            payload = {"command": command, "environment": environment, "lengths": args.lengths}
            payload["records"] = [asdict(t) for t in trials]
            write_report(args.out, "e2e", payload, _table(trials, args.lengths))
    table = _table(trials, args.lengths)
    plot_memory(trials, args.out / "e2e-memory.png", f"{args.preset}: peak memory vs batch")
    print(table)
    return 0 if any(t.ok for t in trials) else 1


def checked_or_exit(parser: argparse.ArgumentParser, preset: str, sets: list[str]) -> Any:
    """The preset with the overrides applied, validated before any trial starts (else exit 2)."""
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset

    try:
        return load_preset(preset, sets)[0]
    except PresetError as exc:
        parser.exit(2, "\n".join(exc.lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
