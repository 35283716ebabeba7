"""Rollouts at realistic completion lengths: what finished rows cost the graph decoder, kept or compacted.

    python benchmarks/real_lengths.py --data /work/shared/data/gsm8k/test.jsonl --out DIR [--shapes 128x1024,64x2048]
    python benchmarks/real_lengths.py --device cpu --tiny --out DIR      # smoke mode (tests)

Model: builtin:qwen3-0.6b-shape (random weights, bf16) decoded as the trainer decodes it: the graph decoder on the
fused decode copy. Random weights almost never emit EOS, so the workload forces it: each row's completion length is
drawn by `grpo_tui.tasks.workload.realistic_lengths` (mean ~35% of the cap, ~10% of rows at the cap, seeded, the same
draw for every variant; a row that samples the EOS id sooner ends sooner, counted in `ended_early`). Per shape (rows x cap), each variant runs once untimed (compile, capture) and once timed:

    to-cap     every row decodes to the cap (EOS ignored): the work of the all-to-the-cap rollout
    kept       the realistic lengths, finished rows kept in the batch (emitting pad) until the last row ends
    compacted  the realistic lengths, the rows still decoding moved to the front and decoded alone

`allowance_s` is the target's budget for the realistic rollout: 1.3 x (generated tokens / (rows x cap)) x the
to-cap decode time, plus the prefill; `compacted_over_allowance` <= 1 meets it. Writes DIR/real-lengths.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from generation_bench import load_prompts, sync

from grpo_tui.tasks.workload import realistic_lengths

VARIANTS = ("to-cap", "kept", "compacted")
ALLOWANCE = 1.3


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        rows, _, cap = item.strip().partition("x")
        if not (rows.isdecimal() and cap.isdecimal() and int(rows) > 0 and int(cap) > 0):
            raise ValueError(f"--shapes: got {item!r}; allowed: ROWSxCAP pairs, e.g. 128x1024,64x2048")
        shapes.append((int(rows), int(cap)))
    return shapes


def rollout(decoder: Any, model: Any, prompts: list[list[int]], cap: int, stop: list[int], pad: int, lengths):
    from grpo_tui.train.generation import Sampling

    with torch.no_grad():
        return decoder.generate(model, prompts, cap, stop, pad, Sampling(), lengths)


def timed(device: torch.device, run) -> tuple[Any, float]:
    sync(device)
    start = time.perf_counter()
    out = run()
    sync(device)
    return out, time.perf_counter() - start


def measure_shape(
    model: Any, prompts: list[list[int]], rows: int, cap: int, stop: int, pad: int, seed: int, compiled: bool = True
):
    from grpo_tui.train.generation import StaticDecoder

    device = model.device
    graph = device.type == "cuda"
    lengths = realistic_lengths(rows, cap, seed)
    batch = prompts[:rows]
    decoders = {name: StaticDecoder(graph, graph and compiled, compact=name == "compacted") for name in VARIANTS}
    row: dict[str, Any] = {"rows": rows, "cap": cap, "mean_length": sum(lengths) / rows}
    for name, decoder in decoders.items():
        drawn = None if name == "to-cap" else lengths
        stops = [] if name == "to-cap" else [stop]
        # untimed: compile and capture (every row count it meets); its time says what a first rollout costs
        _, first_s = timed(device, lambda d=decoder, s=stops, n=drawn: rollout(d, model, batch, cap, s, pad, n))
        out, seconds = timed(device, lambda d=decoder, s=stops, n=drawn: rollout(d, model, batch, cap, s, pad, n))
        generated = sum(map(len, out.ids))
        early = 0 if name == "to-cap" else sum(len(ids) < n for ids, n in zip(out.ids, lengths, strict=True))
        assert all(len(ids) <= cap for ids in out.ids)
        row[name] = {
            "s": round(seconds, 4),
            "generated": generated,
            "ended_early": early,
            "row_counts": decoder.row_counts,
        }
        decoder.release()
    _, prefill_s = timed(device, lambda: rollout(decoders["kept"], model, batch, 1, [], pad, None))
    decoders["kept"].release()
    share = row["kept"]["generated"] / (rows * cap)
    allowance = ALLOWANCE * share * (row["to-cap"]["s"] - prefill_s) + prefill_s
    row.update(
        prefill_s=round(prefill_s, 4),
        generated_share=round(share, 4),
        allowance_s=round(allowance, 4),
        compacted_over_allowance=round(row["compacted"]["s"] / allowance, 3),
        compacted_over_kept=round(row["compacted"]["s"] / row["kept"]["s"], 3),
    )
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'shape':>9} {'mean':>6} {'to-cap s':>9} {'kept s':>8} {'compact s':>9} {'allow s':>8} {'c/allow':>7} {'c/kept':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['rows']:>4}x{r['cap']:<4} {r['mean_length']:>6.0f} {r['to-cap']['s']:>9.3f} {r['kept']['s']:>8.3f} "
            f"{r['compacted']['s']:>9.3f} {r['allowance_s']:>8.3f} {r['compacted_over_allowance']:>7.2f} "
            f"{r['compacted_over_kept']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny built-in model and small sizes (smoke test)")
    parser.add_argument("--data", type=Path, help="GSM8K-style .jsonl with a 'question' column")
    parser.add_argument("--shapes", default=None, help="ROWSxCAP,... (default 128x1024,64x2048; 24x48 with --tiny)")
    parser.add_argument("--seed", type=int, default=0, help="the completion-length draw")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="graphs of the plain step, not torch.compile's (no compile per row count; slower per step)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes or ("24x48" if args.tiny else "128x1024,64x2048"))
    except ValueError as exc:
        parser.error(str(exc))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tui.train.decode_copy import DecodeCopy

    if args.tiny:
        from grpo_tui.tasks.tiny import ensure_tiny_model

        path, dtype, name = ensure_tiny_model(), torch.float32, "builtin:tiny-qwen3 (fp32)"
    else:
        from grpo_tui.tasks.shapes import build_shaped_model

        path, dtype, name = build_shaped_model("qwen3-0.6b-shape"), torch.bfloat16, "qwen3-0.6b-shape (bf16)"
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    copy = DecodeCopy("keep")
    copy.build(model)
    decoded = copy.refresh(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = load_prompts(tokenizer, args.data, max(rows for rows, _ in shapes), 16 if args.tiny else 256)
    # EOS: the last id (an unused one in Qwen3's padded vocabulary). Random weights may still sample it, ending a
    # row before its drawn length: `ended_early` counts those rows.
    stop = model.config.vocab_size - 1
    result: dict[str, Any] = {
        "benchmark": "real-lengths decode",
        "command": " ".join(["python", "benchmarks/real_lengths.py", *(argv if argv is not None else sys.argv[1:])]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "model": name,
        "prompts": str(args.data) if args.data else "synthetic",
        "seed": args.seed,
        "compiled": not args.plain,
        "rows": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for rows, cap in shapes:
        result["rows"].append(measure_shape(decoded, prompts, rows, cap, stop, pad, args.seed, not args.plain))
        (args.out / "real-lengths.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
