"""Stacked bars of a step's phase times (and its peak) per run, from step_times.py's or fsdp_rollouts.py's JSON.

    python benchmarks/plot_steps.py --out steps.png LABEL=step-times.json:impl/batch LABEL=fsdp-rollouts.json:label ...

Each LABEL names one bar; the part after ":" picks the row: impl/batch of a step-times.json, or a row's label in an
fsdp-rollouts.json. `LABEL=SECONDS` draws a grey bar of a step known only by its total (say where it comes from
beside the command). Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo_tui.runs.metrics import PHASES

COLOURS = {"generation": "#4c72b0", "scoring": "#dd8452", "loss": "#55a868", "optimizer": "#c44e52"}


def pick(spec: str) -> tuple[str, dict]:
    label, _, rest = spec.partition("=")
    try:
        return label, {"step_s": float(rest), "phases_s": {}, "peak_gib": None}
    except ValueError:
        pass
    path, _, key = rest.partition(":")
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):  # fsdp_rollouts.py: rows by label, the phases as columns
        row = next((r for r in data["rows"] if r["label"] == key), None)
        if row is not None and "error" not in row:
            phases = {phase: row.get(f"{phase}_s") for phase in PHASES}
            row = {**row, "phases_s": phases, "step": "2-3"}
    else:
        impl, _, batch = key.partition("/")
        row = next((r for r in data if r["impl"] == impl and str(r["batch"]) == batch), None)
    if row is None or "error" in row:
        raise SystemExit(f"{spec}: no finished row {key} in {path}")
    return label, row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bars", nargs="+", metavar="LABEL=JSON:IMPL/BATCH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="Whole GRPO step on one H200 (Qwen3-0.6B shape, completion 256)")
    args = parser.parse_args(argv)  # before matplotlib: --help answers without it
    try:
        import matplotlib
    except ImportError:
        print("plot_steps: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picked = [pick(spec) for spec in args.bars]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(picked) + 1.6))
    labelled: set[str] = set()  # each phase named once in the legend
    for y, (_label, row) in enumerate(picked):
        left = 0.0
        for phase in PHASES:
            seconds = row["phases_s"].get(phase) or 0.0
            named = seconds and phase not in labelled
            ax.barh(y, seconds, left=left, color=COLOURS[phase], label=phase if named else None)
            if named:
                labelled.add(phase)
            left += seconds
        if not row["phases_s"]:  # known only by its total
            ax.barh(y, row["step_s"], color="#999999")
        peak = "" if row.get("peak_gib") is None else f" · {row['peak_gib']:.1f} GiB"
        ax.text(row["step_s"] + 0.2, y, f"{row['step_s']:.1f} s{peak}", va="center", fontsize=8)
    ax.set_yticks(range(len(picked)), [label for label, _ in picked], fontsize=8)
    ax.invert_yaxis()
    steps = sorted({str(row.get("step", 2)) for _, row in picked if row["phases_s"]})
    ax.set_xlabel(f"seconds per step (step {', '.join(steps)}{'; mean' if any('-' in s for s in steps) else ''})")
    ax.set_xlim(0, max(r["step_s"] for _, r in picked) * 1.5)
    ax.set_title(args.title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
