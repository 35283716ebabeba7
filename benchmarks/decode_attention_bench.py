"""Time grpo_kernels' decode attention against sdpa's folded attention, over a grid of the kernel's settings.

    python benchmarks/decode_attention_bench.py [--shapes 128x512x300,512x512x300] [--quick] --out DIR

A shape is ROWSxLENGTHxFILLED: the cache has LENGTH slots per row, rows start at a random left-padding
offset below 200 and every slot up to FILLED is written (the decoder's mask). Qwen3-0.6B's heads: 16 query
and 8 key/value heads of 128, bf16. Each setting (BLOCK_KEYS, NUM_STAGES, NUM_WARPS, TARGET_PROGRAMS) is timed
inside a CUDA graph of 20 calls (launch cost as in the decoder), after a check against the fp32 twin. Prints
one JSON line per shape (sdpa, the best setting, the default's time, the bandwidth over allowed slots) and
writes every timing to DIR/decode-attention.json. CUDA only; `--device cpu` runs a smoke pass (the torch
twin, one setting, plain timing).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch

import grpo_kernels.decode_attention as da
from grpo_tui.train.decode_attention import folded_attention

KV_HEADS, GROUP, DIM = 8, 2, 128
GRID = {"block": (64, 128), "stages": (2, 3), "warps": (4, 8), "target": (528, 2112)}
# The kernel module's constant behind each grid name
SETTINGS = {"block": "BLOCK_KEYS", "stages": "NUM_STAGES", "warps": "NUM_WARPS", "target": "TARGET_PROGRAMS"}
DEFAULT = {name: int(getattr(da, constant)) for name, constant in SETTINGS.items()}


def inputs(rows: int, length: int, filled: int, device: str, dtype: torch.dtype, seed: int = 0) -> tuple:
    generator = torch.Generator(device=device).manual_seed(seed)
    query = torch.randn(rows, KV_HEADS * GROUP, 1, DIM, device=device, generator=generator).to(dtype)
    key, value = (torch.randn(rows, KV_HEADS, length, DIM, device=device, generator=generator).to(dtype) for _ in "kv")
    index = torch.arange(length, device=device)
    starts = torch.randint(0, min(200, filled), (rows,), device=device, generator=generator)
    mask = (index[None] >= starts[:, None]) & (index[None] <= filled)
    return query, key, value, mask


def timed_us(fn: Any, cuda: bool, reps: int = 200) -> float:
    """Mean microseconds per call; on CUDA replayed from a graph of 20 calls, as the decoder replays its step."""
    for _ in range(3):
        fn()
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps // 20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / (reps // 20 * 20) * 1000


def apply(setting: dict[str, int]) -> None:
    """Set the kernel's constants the setting names (the others stay)."""
    for name, value in setting.items():
        setattr(da, SETTINGS[name], value)


def parse_part(part: str, option: str) -> tuple[str, tuple[int, ...]]:
    """One `NAME=INT[,INT...]` of an option's text: the grid name and its values; a one-line ValueError else."""
    name, _, values = part.partition("=")
    items = values.split(",")
    if name not in GRID or not values or not all(v.isdecimal() for v in items):
        raise ValueError(f"{option}: got {part!r}; allowed: NAME=INT[,INT...] with NAME in {', '.join(GRID)}")
    return name, tuple(int(v) for v in items)


def parse_grid(text: str) -> dict[str, tuple[int, ...]]:
    """`block=32,64;stages=1,2,3` -> GRID with those axes replaced (the others keep GRID's values)."""
    return {**GRID, **dict(parse_part(part, "--grid") for part in filter(None, text.split(";")))}


def run_shape(shape: tuple[int, int, int], settings: list[dict[str, int]], device: str) -> tuple[dict, list[dict]]:
    rows, length, filled = shape
    cuda = device == "cuda"
    query, key, value, mask = inputs(rows, length, filled, device, torch.bfloat16 if cuda else torch.float32)
    scale = DIM**-0.5
    sdpa_us = timed_us(lambda: folded_attention(None, query, key, value, mask[:, None, None], scaling=scale), cuda)
    reference = da.decode_attention_torch(query.float(), key.float(), value.float(), mask, scale)
    rows_out = []
    for setting in settings:
        apply(setting)
        error = (da.decode_attention(query, key, value, mask, scale).float() - reference).abs().max().item()
        us = timed_us(lambda: da.decode_attention(query, key, value, mask, scale), cuda)
        rows_out.append({"rows": rows, "length": length, "filled": filled, **setting, "us": round(us, 2), "err": error})
    apply(DEFAULT)
    best = min(rows_out, key=lambda r: r["us"])
    default = next((r for r in rows_out if all(r[k] == v for k, v in DEFAULT.items())), None)
    allowed_bytes = int(mask.sum()) * KV_HEADS * DIM * 2 * key.element_size()  # K and V of allowed slots
    summary = {
        "rows": rows,
        "length": length,
        "filled": filled,
        "sdpa_us": round(sdpa_us, 2),
        "best": best,
        "default_us": default["us"] if default else None,
        "allowed_kv_gb_s_at_best": round(allowed_bytes / best["us"] / 1e3, 1),
    }
    return summary, rows_out


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdecimal() and int(p) > 0 for p in parts) or int(parts[2]) >= int(parts[1]):
            raise ValueError(
                f"--shapes: got {item!r}; allowed: ROWSxLENGTHxFILLED with FILLED < LENGTH, e.g. 128x512x300"
            )
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="128x512x300,512x512x300")
    parser.add_argument("--quick", action="store_true", help="the default setting only, no grid")
    parser.add_argument(
        "--grid",
        default="",
        help=f"axes to sweep instead of the default's, e.g. 'block=32,64;stages=2' ({', '.join(GRID)})",
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        shapes, axes = parse_shapes(args.shapes), parse_grid(args.grid)
    except ValueError as error:
        parser.error(str(error))
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; allowed: --device cpu for a smoke pass")
    grid = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    settings = [DEFAULT] if args.quick or args.device == "cpu" else grid
    results: dict[str, Any] = {"shapes": [], "timings": [], "grid": axes, "default": DEFAULT}
    for shape in shapes:
        summary, timings = run_shape(shape, settings, args.device)
        print(json.dumps(summary), flush=True)
        results["shapes"].append(summary)
        results["timings"] += timings
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode-attention.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
