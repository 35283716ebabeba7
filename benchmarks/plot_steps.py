"""Stacked bars of a step's phase times (and its peak) per run, from step_times.py's JSON files.

    python benchmarks/plot_steps.py --out steps.png LABEL=step-times.json:impl/batch ...

Each LABEL names one bar; the part after ":" picks the row (impl/batch) of that step-times.json. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_tui.runs.metrics import PHASES

COLOURS = {"generation": "#4c72b0", "scoring": "#dd8452", "loss": "#55a868", "optimizer": "#c44e52"}


def pick(spec: str) -> tuple[str, dict]:
    label, _, rest = spec.partition("=")
    path, _, key = rest.partition(":")
    impl, _, batch = key.partition("/")
    rows = json.loads(Path(path).read_text())
    row = next((r for r in rows if r["impl"] == impl and str(r["batch"]) == batch), None)
    if row is None or "error" in row:
        raise SystemExit(f"{spec}: no finished row {key} in {path}")
    return label, row


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bars", nargs="+", metavar="LABEL=JSON:IMPL/BATCH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="Whole GRPO step on one H200 (Qwen3-0.6B shape, completion 256)")
    args = parser.parse_args(argv)
    picked = [pick(spec) for spec in args.bars]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(picked) + 1.6))
    for y, (_label, row) in enumerate(picked):
        left = 0.0
        for phase in PHASES:
            seconds = row["phases_s"].get(phase) or 0.0
            ax.barh(y, seconds, left=left, color=COLOURS[phase], label=phase if y == 0 else None)
            left += seconds
        ax.text(row["step_s"] + 0.2, y, f"{row['step_s']:.1f} s · {row['peak_gib']:.1f} GiB", va="center", fontsize=8)
    ax.set_yticks(range(len(picked)), [label for label, _ in picked], fontsize=8)
    ax.invert_yaxis()
    steps = sorted({str(row.get("step", 2)) for _, row in picked})
    ax.set_xlabel(f"seconds per step (step {', '.join(steps)}{'; mean' if any('-' in s for s in steps) else ''})")
    ax.set_xlim(0, max(r["step_s"] for _, r in picked) * 1.5)
    ax.set_title(args.title, fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
