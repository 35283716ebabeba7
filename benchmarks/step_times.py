"""Step time, per-phase times and peak of finished runs, from their metrics.jsonl: one table row per run.

    python benchmarks/step_times.py [--out table.json] LABEL=RUN_DIR_OR_METRICS ...

LABEL is `impl/batch` (e.g. `chunked/64`). Each row is one step of the run: the last one, except a
profiled step (`--skip-step N`: the profiler slows it) and except step 1 when a later one is left (the
first step compiles and autotunes). `--mean`: the mean of every such step instead (step 2 on), with the
spread of the step time; the peak is the highest. Prints a markdown table; `--out` also writes the rows
as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from grpo_tui.runs.metrics import (
    COPY_REFRESH_KEY,
    GENERATION_BACKEND_KEY,
    GENERATION_RATE_KEY,
    MISMATCH_MEAN_KEY,
    PHASES,
    STEP_TIME_KEY,
    phase_time_key,
    read_records,
    step_records,
)


def device_name() -> str:
    """The CUDA device's name, "cpu" without one ("unknown" where torch cannot say): a result's `device`."""
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # the table still prints
        return "unknown"


def pick_steps(steps: list[dict[str, Any]], skip: set[int]) -> list[dict[str, Any]]:
    """The steps not in `skip`, leaving out step 1 when a later one is left."""
    candidates = [r for r in steps if r.get("step") not in skip]
    later = [r for r in candidates if r.get("step") != 1]
    return later or candidates


def mean_of(values: list[Any]) -> float | None:
    """The mean of the numbers among `values` (4 decimals), None where there are none."""
    numbers = [v for v in values if isinstance(v, (int, float))]
    return round(sum(numbers) / len(numbers), 4) if numbers else None


def mean_step(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One record standing for `steps`: their mean times, rate, decode-copy refresh and decode/train mismatch, the
    highest peak, `step` as "2-4"."""
    keys = [STEP_TIME_KEY, "step_time", GENERATION_RATE_KEY, *(phase_time_key(p) for p in PHASES)]
    keys += [COPY_REFRESH_KEY, MISMATCH_MEAN_KEY, "completions/mean_length"]
    merged: dict[str, Any] = {key: mean_of([r.get(key) for r in steps]) for key in keys}
    numbers = [r.get("step") for r in steps]
    merged["step"] = f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else numbers[0]
    merged["memory"] = max((r.get("memory") or {} for r in steps), key=peak_mib)
    merged[GENERATION_BACKEND_KEY] = steps[-1].get(GENERATION_BACKEND_KEY)
    times = [r[STEP_TIME_KEY] for r in steps if isinstance(r.get(STEP_TIME_KEY), (int, float))]
    merged["step_s_range"] = [round(min(times), 4), round(max(times), 4)] if times else None
    return merged


def peak_mib(memory: dict[str, Any]) -> float:
    """The highest GPU peak of a step record's `memory` (0 without GPUs)."""
    return max((g.get("peak_mib", 0.0) for g in memory.get("gpus") or []), default=0.0)


def row(label: str, path: Path, skip: set[int], mean: bool = False) -> dict[str, Any]:
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    impl, _, batch = label.partition("/")
    out: dict[str, Any] = {"impl": impl, "batch": batch, "metrics": str(metrics)}
    records = read_records(metrics) if metrics.is_file() else []
    chosen = pick_steps(step_records(records), skip)
    step = (mean_step(chosen) if mean else chosen[-1]) if chosen else None
    errors = [r.get("message") or r.get("event") for r in records if r.get("event") in ("error", "oom")]
    if step is None:
        out["error"] = errors[-1] if errors else "no step record"
        return out
    gpus = (step.get("memory") or {}).get("gpus") or []
    out.update(
        step=step["step"],
        step_s=step.get(STEP_TIME_KEY),
        trl_step_time_s=round(step["step_time"], 4) if isinstance(step.get("step_time"), float) else None,
        **({"step_s_range": step["step_s_range"]} if mean else {}),
        phases_s={phase: step.get(phase_time_key(phase)) for phase in PHASES},
        peak_gib=round(peak_mib(step["memory"]) / 1024, 2) if gpus else None,
        backend=step.get(GENERATION_BACKEND_KEY),
        generation_tokens_per_s=step.get(GENERATION_RATE_KEY),
    )
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["impl", "batch", "step", "step s", *(f"{p} s" for p in PHASES), "TRL step_time s", "peak GiB"]
    head += ["backend", "gen tok/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['batch']} | failed: {r['error']} |")
            continue
        cells = [r["impl"], r["batch"], r["step"], r["step_s"], *r["phases_s"].values(), r["trl_step_time_s"]]
        cells += [r["peak_gib"], r.get("backend"), r.get("generation_tokens_per_s")]
        lines.append("| " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    parser.add_argument("--skip-step", type=int, action="append", default=[], help="a profiled step to leave out")
    parser.add_argument("--mean", action="store_true", help="the mean of steps 2 on, not the last step")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"runs: got {spec!r}; allowed: LABEL=PATH, e.g. chunked/64=/tmp/runs/x")
        rows.append(row(label, Path(path), set(args.skip_step), args.mean))
    print(markdown(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
