"""Reward parity of two runs (e.g. loss.impl chunked vs naive, same seed): stats as JSON and an overlay PNG.

python benchmarks/parity.py A/metrics.jsonl B/metrics.jsonl --labels chunked,naive --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_tui.runs.metrics import read_records, step_records

WINDOW = 20  # steps in the moving average the curves are compared by (single steps are sampling noise)


def rewards(path: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["reward"]) for r in step_records(read_records(path)) if "reward" in r}


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def compare(a: dict[int, float], b: dict[int, float]) -> dict[str, float | int]:
    steps = sorted(set(a) & set(b))
    ya, yb = [a[s] for s in steps], [b[s] for s in steps]
    ma, mb = moving_average(ya, WINDOW), moving_average(yb, WINDOW)
    n = min(WINDOW, len(steps))
    identical = next((i for i, (x, y) in enumerate(zip(ya, yb)) if x != y), len(steps))
    return {
        "steps": len(steps),
        "max_abs_delta_reward": max(abs(x - y) for x, y in zip(ya, yb)),
        "mean_abs_delta_reward": sum(abs(x - y) for x, y in zip(ya, yb)) / len(steps),
        f"max_abs_delta_reward_ma{WINDOW}": max(abs(x - y) for x, y in zip(ma, mb)),
        "identical_first_steps": identical,
        "a_first20": sum(ya[:n]) / n,
        "a_last20": sum(ya[-n:]) / n,
        "b_first20": sum(yb[:n]) / n,
        "b_last20": sum(yb[-n:]) / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--labels", default="chunked,naive")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--title", default="reward vs step")
    args = parser.parse_args(argv)
    la, lb = args.labels.split(",")
    ra, rb = rewards(args.a), rewards(args.b)
    stats = compare(ra, rb)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps({"labels": [la, lb], **stats}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, r, colour in ((la, ra, "tab:blue"), (lb, rb, "tab:orange")):
        steps = sorted(r)
        ys = [r[s] for s in steps]
        ax.plot(steps, ys, color=colour, alpha=0.25, lw=0.8)
        ax.plot(steps, moving_average(ys, WINDOW), color=colour, lw=2, label=f"{label} ({WINDOW}-step mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(f"{args.title}: max |Δ| of {WINDOW}-step means {stats[f'max_abs_delta_reward_ma{WINDOW}']:.3f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "parity.png")
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
