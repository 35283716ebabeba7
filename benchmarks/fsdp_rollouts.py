"""Whole training steps of the FSDP + LoRA preset per rollout path, and rollout rows against the bandwidth bound.

    python benchmarks/fsdp_rollouts.py --data GSM8K.jsonl --out DIR [--specs LABEL ...] [--rollouts BENCH.json ...]

Each spec is a fresh headless run of `qwen3-1.7b-gsm8k-fsdp-lora` (or another preset) on the Qwen3-1.7B shape with
random weights, one process, GSM8K prompts, `--steps` steps (default 3); its row is the mean of steps 2 on (step 1
compiles). `--rollouts` adds the rows of `generation_bench.py` results (tokens/s and the fraction of the memory-
bandwidth bound per batch and length); `--rows-from` puts the rows of earlier runs of this script first (their
commands kept in a list with this one). `--profile-step N` runs step N of each spec under torch.profiler
($GRPO_TUI_PROFILE_STEP), leaves it out of the row's mean and copies its operator tables to DIR/LABEL-profile-stepN.txt.
Writes DIR/fsdp-rollouts.json with `rows` and the command; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from step_times import device_name, mean_step, peak_mib, pick_steps

from grpo_tui.runs.metrics import (
    COPY_REFRESH_KEY,
    DECODE_COPY_KEY,
    GENERATION_BACKEND_KEY,
    GENERATION_RATE_KEY,
    MISMATCH_MAX_KEY,
    MISMATCH_MEAN_KEY,
    STEP_TIME_KEY,
    phase_time_key,
    read_records,
    step_records,
)
from grpo_tui.train.profiling import PROFILE_STEP_ENV

PRESET = "qwen3-1.7b-gsm8k-fsdp-lora"
# label -> (fsdp, lora, extra --set overrides); every spec also gets COMMON_SETS
SPECS: dict[str, tuple[bool, bool, tuple[str, ...]]] = {
    "fsdp2-graph-keep": (True, True, ()),
    "fsdp2-graph-free": (True, True, ("grpo.decode_copy=free",)),
    "graph-lora-merged": (False, True, ("distributed.fsdp=false",)),
    "graph-lora-unmerged": (False, True, ("distributed.fsdp=false", "grpo.decode_copy=off")),
    "graph-no-lora": (False, False, ("distributed.fsdp=false", "peft.enabled=false")),
    # Full fine-tuning with transformers' forward on the live weights (no copy: the path before the fused forward)
    "graph-no-lora-live": (False, False, ("distributed.fsdp=false", "peft.enabled=false", "grpo.decode_copy=off")),
    "trl-user-lora": (False, True, ("distributed.fsdp=false", "loss.impl=trl", "grpo.generation_backend=generate")),
    "fsdp2-generate": (True, True, ("grpo.generation_backend=generate",)),
    # Four length groups for scoring and each loss micro-batch, as padded groups run, instead of the packed default of
    # one: each forward's fixed costs four times, for a lower activation peak
    "fsdp2-graph-keep-4groups": (True, True, ("grpo.length_groups=4",)),
    "graph-lora-merged-4groups": (False, True, ("distributed.fsdp=false", "grpo.length_groups=4")),
}
# Seconds a run stopped at its time limit gets to finish its step before it is killed
STOP_GRACE_S = 30
DEFAULT_SPECS = [
    label for label in SPECS if not label.endswith("-4groups") and label not in ("fsdp2-generate", "graph-no-lora-live")
]


def common_sets(model: str, data: str, batch: int, length: int, steps: int) -> list[str]:
    return [
        f"model.name_or_path={model}",
        f"data.source={data}",
        "distributed.num_processes=1",
        f"grpo.per_device_batch_size={batch}",
        "grpo.gradient_accumulation_steps=1",
        f"grpo.max_completion_length={length}",
        f"grpo.max_steps={steps}",
        "logging.save_steps=0",
        "logging.completions_per_step=0",
    ]


def run_row(
    label: str, preset: str, sets: list[str], runs: Path, log: Path, timeout: int, profile_step: int | None = None
) -> dict[str, Any]:
    """One fresh headless run and its row (the mean of steps 2 on, but `profile_step`, which runs under
    torch.profiler: its tables are copied beside `log`)."""
    fsdp, lora, extra = SPECS[label]
    argv = [sys.executable, "-m", "grpo_tui.cli", "run", preset, "--headless", "--runs-dir", str(runs)]
    for item in [*sets, *extra]:
        argv += ["--set", item]
    env = dict(os.environ)
    env.pop(PROFILE_STEP_ENV, None)
    if profile_step is not None:
        env[PROFILE_STEP_ENV] = str(profile_step)
    start = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
        try:
            code = process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:  # Ctrl-C: the run stops at its next step boundary, then by force
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            timed_out = True
    row: dict[str, Any] = {"label": label, "preset": preset, "fsdp": fsdp, "lora": lora, "exit": code}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    metrics = sorted(runs.glob("*/metrics.jsonl"))
    records = read_records(metrics[-1]) if metrics else []
    steps = pick_steps(step_records(records), set() if profile_step is None else {profile_step})
    for table in sorted(runs.glob(f"*/profile-step{profile_step}*.txt")) if profile_step is not None else ():
        shutil.copyfile(table, log.parent / f"{label}-{table.name}")
    if timed_out:
        row["timed_out_s"] = timeout
    if not steps:
        errors = [r.get("message") for r in records if r.get("event") in ("error", "oom")]
        row["error"] = (errors or [f"timed out after {timeout} s" if timed_out else "no step record"])[-1]
        return row
    merged = mean_step(steps)  # the mean of steps 2 on, the highest peak
    peak, copy = peak_mib(merged["memory"]), steps[-1].get(DECODE_COPY_KEY)
    row.update(
        backend=merged[GENERATION_BACKEND_KEY],
        batch=int(_set_value(sets, "grpo.per_device_batch_size")),
        completion_length=int(_set_value(sets, "grpo.max_completion_length")),
        steps=[s["step"] for s in steps],
        step_s=merged[STEP_TIME_KEY],
        generation_s=merged[phase_time_key("generation")],
        scoring_s=merged[phase_time_key("scoring")],
        loss_s=merged[phase_time_key("loss")],
        generation_tokens_per_s=merged[GENERATION_RATE_KEY],
        bound_fraction=None,
        peak_gib=round(peak / 1024, 2) if peak else None,
        decode_copy_gib=None if copy is None else round(copy / 1024, 3),
        copy_refresh_s=merged[COPY_REFRESH_KEY],
        logp_mismatch_mean=merged[MISMATCH_MEAN_KEY],
        logp_mismatch_max=max((s[MISMATCH_MAX_KEY] for s in steps if MISMATCH_MAX_KEY in s), default=None),
        completion_mean_length=merged["completions/mean_length"],
        fallbacks=[r.get("reason") for r in records if r.get("event") == "generation_fallback"],
    )
    return row


def _set_value(sets: list[str], key: str) -> str:
    return next(item.split("=", 1)[1] for item in reversed(sets) if item.startswith(key + "="))


def rollout_rows(bench: Path, result: dict[str, Any]) -> list[dict[str, Any]]:
    """generation_bench.py's throughput rows (`result`, read from `bench`) as rows of this file (the 0.6B shape,
    no FSDP, no LoRA)."""
    rows = []
    for r in result["throughput"]:
        new_tokens = r.get("new_tokens", result["new_tokens"])
        copy = r.get("decode_copy_mib")
        rows.append(
            {
                "label": f"rollout {r['backend']} {r['batch']}x{new_tokens}",
                "preset": result["model"],
                "fsdp": False,
                "lora": False,
                "backend": r["backend"],
                "batch": r["batch"],
                "completion_length": new_tokens,
                "step_s": None,
                "generation_s": r["s"],
                "generation_tokens_per_s": round(r["tokens_per_s"], 1),
                "bound_tokens_per_s": round(r["bound_tokens_per_s"], 1),
                "bound_fraction": round(r["bound_fraction"], 4),
                "decode_bound_fraction": None
                if "decode_bound_fraction" not in r
                else round(r["decode_bound_fraction"], 4),
                "prefill_s": r.get("prefill_s"),
                "peak_gib": None if r["peak_mib"] is None else round(r["peak_mib"] / 1024, 2),
                "decode_copy_gib": None if copy is None else round(copy / 1024, 3),
                "source": str(bench),
            }
        )
    return rows


def _cell(row: dict[str, Any], key: str, spec: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'label':28} {'backend':9} {'batch':>5} {'step s':>7} {'gen s':>7} {'tok/s':>8} {'bound':>6} {'peak GiB':>8} {'copy GiB':>8} {'Δlogp':>8}"
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['label']:28} failed (exit {r.get('exit')}): {r['error']}")
            continue

        lines.append(
            f"{r['label']:28} {str(r.get('backend')):9} {r['batch']:>5} {_cell(r, 'step_s', '.3f'):>7} "
            f"{_cell(r, 'generation_s', '.3f'):>7} {_cell(r, 'generation_tokens_per_s', '.0f'):>8} "
            f"{_cell(r, 'bound_fraction', '.1%'):>6} {_cell(r, 'peak_gib', '.2f'):>8} "
            f"{_cell(r, 'decode_copy_gib', '.2f'):>8} {_cell(r, 'logp_mismatch_mean', '.4f'):>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="GSM8K-style .jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default=PRESET)
    parser.add_argument("--model", default="builtin:qwen3-1.7b-shape")
    parser.add_argument("--specs", nargs="*", default=DEFAULT_SPECS, help=f"any of: {', '.join(SPECS)}")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per run")
    parser.add_argument("--rollouts", type=Path, nargs="*", default=[], help="generation_bench.py JSON results")
    parser.add_argument(
        "--rows-from",
        type=Path,
        nargs="*",
        default=[],
        help="earlier results of this script on the same machine (one machine session holds only so many runs): their "
        "rows come first and their commands are kept beside this one",
    )
    parser.add_argument(
        "--warmup",
        default=None,
        help="a spec run first (2 steps) and not reported: the first training process on a machine compiles "
        "cuDNN's attention for each sequence length and the decode step, which later runs find cached",
    )
    parser.add_argument(
        "--profile-step",
        type=int,
        default=None,
        metavar="N",
        help="run step N of each spec under torch.profiler, its tables copied to DIR (left out of the row's mean)",
    )
    args = parser.parse_args(argv)
    if args.profile_step is not None and not 2 <= args.profile_step < args.steps:
        parser.error(
            f"--profile-step: got {args.profile_step}; allowed: a step from 2 to --steps - 1 ({args.steps - 1}), so "
            "that the row keeps a step besides it and the first"
        )
    unknown = [s for s in args.specs if s not in SPECS]
    if unknown:
        parser.error(f"--specs: got {', '.join(unknown)}; allowed: {', '.join(SPECS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data if args.data.startswith("builtin:") else str(Path(args.data).resolve())
    sets = common_sets(args.model, data, args.batch, args.length, args.steps)
    if args.warmup is not None:
        if args.warmup not in SPECS:
            parser.error(f"--warmup: got {args.warmup!r}; allowed: {', '.join(SPECS)}")
        warm_sets = common_sets(args.model, data, args.batch, args.length, 2)
        warm = run_row(
            args.warmup, args.preset, warm_sets, args.out / "runs" / "warmup", args.out / "warmup.log", args.timeout
        )
        print(f"warm-up {args.warmup}: exit {warm['exit']} in {warm['wall_s']} s", flush=True)
    earlier_rows, commands, devices = [], [], []
    for earlier in args.rows_from:
        result = json.loads(earlier.read_text())
        earlier_rows += result["rows"]
        commands += result["command"] if isinstance(result["command"], list) else [result["command"]]
        devices.append(result.get("device"))
    benches = {bench: json.loads(bench.read_text()) for bench in args.rollouts}
    devices += [result.get("device") for result in benches.values()]
    # A merge alone (no spec run here) measured nothing on this machine: its device is the one the merged files name
    named = " + ".join(dict.fromkeys(d for d in devices if d))
    device = device_name() if args.specs or not named else named
    steps: list[dict[str, Any]] = []
    rollouts = [row for bench, result in benches.items() for row in rollout_rows(bench, result)]
    command = " ".join(["python", "benchmarks/fsdp_rollouts.py", *(argv if argv is not None else sys.argv[1:])])
    result = {
        "what": "whole steps of the FSDP + LoRA preset per rollout path; rollouts against the bandwidth bound",
        "command": [*commands, command] if commands else command,
        "device": device,
        "python": platform.python_version(),
        "env": {k: v for k, v in os.environ.items() if k in ("GRPO_TUI_CACHE_DIR", "HF_HUB_OFFLINE")},
    }

    def save() -> None:  # after every run, so that a call stopped by its time limit keeps what it measured
        result["rows"] = earlier_rows + steps + rollouts
        (args.out / "fsdp-rollouts.json").write_text(json.dumps(result, indent=1) + "\n")

    save()
    for label in args.specs:
        runs = args.out / "runs" / label
        log = args.out / f"{label}.log"
        steps.append(run_row(label, args.preset, sets, runs, log, args.timeout, args.profile_step))
        print(json.dumps(steps[-1]), flush=True)
        save()
    rows = result["rows"]
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
