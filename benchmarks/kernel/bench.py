"""Kernel benchmark: loss + backward time and extra peak memory of each GRPO head implementation.

Run: `python benchmarks/kernel/bench.py --batch 8,32,64 --out kernel.json` (CUDA only; grpo_kernels importable:
installed, or `PYTHONPATH=kernels`).
Providers: floor (the 3 GEMMs over the valid tokens), naive (materialised logits + autograd), trl (TRL 1.16's
ChunkedLogProbFunction on the valid rows, as its trainer calls it, + the GRPO loss math), liger
(LigerFusedLinearGRPOLoss), chunked (ours) and chunked-lean. "extra peak" = max_memory_allocated above what
the inputs hold, gradients included. All-ones masks here; `--padding`/`--lengths` switch to padded batches
(`bench_padded`: cost per valid token, loss and, with `--scoring`, `selective_logprobs`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import bench_padded
import torch
from bench_providers import PROVIDERS, loss_fn, make_inputs
from timing import cell, check, finish, header, int_list, timed


def profile_chunk(rows: int, hidden: int, vocab: int) -> dict:
    """Device ms of each stage of one chunk of `rows` tokens (triton.testing.do_bench medians)."""
    from triton.testing import do_bench

    from grpo_kernels import casts, probs, triton_ops
    from grpo_kernels.chunk_loop import addmm_acc

    g = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.05).bfloat16()
    ids = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    tile = torch.empty(rows, vocab, device="cuda", dtype=torch.bfloat16)
    torch.mm(h, w.t(), out=tile)
    logits = tile.clone()  # the pass rewrites its tile: each of its runs starts from a copy of these
    bad = torch.zeros(rows, device="cuda", dtype=torch.int32)
    parts, tgt = triton_ops.row_stats(tile, ids, 1.0)
    lp, _, _, _ = triton_ops.finish_rows(parts, tgt)
    grad_inputs = dict(
        old=None,
        ref=lp - 0.1,
        adv=torch.randn(rows, device="cuda"),
        w=torch.full_like(lp, 1 / rows),
        beta=0.04,
        epsilon_low=0.2,
        epsilon_high=0.2,
    )
    acc32 = torch.zeros(vocab, hidden, device="cuda")
    acc16 = torch.zeros(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    gh = torch.empty_like(h)
    gvec = torch.randn(rows, device="cuda") * 1e-3
    go = torch.ones((), device="cuda")
    stages = {
        "logits_gemm": lambda: torch.mm(h, w.t(), out=tile),
        "row_stats": lambda: triton_ops.row_stats(tile, ids, 1.0),
        "finish_rows_grad": lambda: triton_ops.finish_rows(parts, tgt, grad_inputs),
        # the loss's one pass, timed with the copy that restores its input (`tile_copy` alone, to subtract)
        "tile_copy": lambda: tile.copy_(logits),
        "probs_pass_with_copy": lambda: probs.probs_pass(tile.copy_(logits), ids, 1.0, bad),
        "dh_gemm": lambda: torch.mm(tile, w, out=gh),
        # the per-row gradient scale c * h_c as the loop runs it, and torch's mixed-dtype mul it replaced
        "row_scale_hc": lambda: casts.scale_rows(h, gvec, gh),
        "row_scale_hc_torch": lambda: torch.mul(h, gvec.unsqueeze(1), out=gh),
        # dW into the fp32 accumulator: the first chunk overwrites it, the others add to it; bf16 for comparison
        "dw_gemm_fp32set": lambda: addmm_acc(acc32, tile.t(), h, first=True),
        "dw_gemm_fp32acc": lambda: addmm_acc(acc32, tile.t(), h),
        "dw_gemm_bf16acc": lambda: addmm_acc(acc16, tile.t(), h),
        # The backward: grad_output x the fp32 dW accumulator into bf16, ours and torch's generic kernel
        "dw_scaled_cast": lambda: casts.scaled_cast(acc32, go, torch.bfloat16),
        "dw_scaled_cast_torch": lambda: torch.mul(acc32, go, out=torch.empty_like(acc32, dtype=torch.bfloat16)),
    }
    out = {"rows": rows}
    for name, fn in stages.items():
        try:
            out[name] = do_bench(fn, warmup=25, rep=100, return_mode="median")
        except Exception as exc:  # a failing stage must not lose the others
            out[name] = float("nan")
            out[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return out


def table(records: list[dict]) -> str:
    """Markdown table: ms / extra MiB per provider and batch, with ratios to the floor and to trl."""
    batches = sorted({r["batch"] for r in records})
    provs = [p for p in dict.fromkeys(r["provider"] for r in records)]
    get = {(r["provider"], r["batch"]): r for r in records}
    lines = ["| batch (tokens) | " + " | ".join(provs) + " |", "|---" * (len(provs) + 1) + "|"]
    for b in batches:
        floor = get.get(("floor", b), {}).get("ms")
        trl = get.get(("trl", b), {}).get("ms")
        cells = [cell(p, get.get((p, b)), floor, trl) for p in provs]
        tokens = get[next((p, b) for p in provs if (p, b) in get)]["tokens"]
        lines.append(f"| {b} ({tokens:,}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_padded_options(ap: argparse.ArgumentParser) -> None:
    """The padded mode's options (`bench_padded`)."""
    ap.add_argument("--padding", default="", help="padded mode: percent of padding positions, e.g. 0,25,50,75")
    ap.add_argument("--valid-tokens", default="4096,16384,32768", help="padded mode: valid tokens per batch")
    ap.add_argument(
        "--lengths",
        default=None,
        help="padded mode: also a batch of real completion lengths: a JSON "
        "list of ints, or a run's metrics.jsonl (its completions/mean_length stream gives the mean)",
    )
    ap.add_argument("--scoring", action="store_true", help="padded mode: also time scoring (selective_logprobs)")
    ap.add_argument(
        "--scoring-chunks",
        default="",
        help="padded mode, with --scoring: also time our scoring at these chunk sizes (providers chunked-c<rows>), "
        "e.g. 256,512,1536",
    )
    ap.add_argument("--seed", type=int, default=0, help="padded mode: seed of the length draws and inputs")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="benchmarks/kernel/bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="8,32,64", help="comma-separated batch sizes (sequences of --seq tokens)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument(
        "--providers",
        default=None,
        help=f"subset of {','.join(PROVIDERS)} (padded mode: of floor,trl,chunked,chunked-lean,naive)",
    )
    ap.add_argument("--chunk-tokens", type=int, default=None, help="our chunk size (default by vocab)")
    ap.add_argument("--sweep-chunks", default="", help="also time ours at these chunk sizes, e.g. 512,2048")
    ap.add_argument("--sweep-lean", default="", help="also time ours lean at these chunk sizes")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--liger-reps", type=int, default=None, help="reps for liger (~2 s each at 32k tokens); default --reps"
    )
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check of ours vs naive")
    ap.add_argument("--profile", default="", help="also time each stage of one chunk at these sizes, e.g. 1024,4096")
    ap.add_argument("--out", default=None, help="write JSON results here")
    add_padded_options(ap)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # argparse already printed a one-line error
        return int(exc.code or 0)
    if args.padding or args.lengths:
        return bench_padded.main(args, argv)
    providers = [p.strip() for p in (args.providers or ",".join(PROVIDERS)).split(",") if p.strip()]
    bad = [p for p in providers if p not in PROVIDERS]
    if bad:
        print(f"--providers: unknown {', '.join(bad)}; allowed: {', '.join(PROVIDERS)}", file=sys.stderr)
        return 2
    try:
        batches = int_list(args.batch, "--batch")
        sweep = [("chunked", c) for c in int_list(args.sweep_chunks, "--sweep-chunks")]
        sweep += [("chunked-lean", c) for c in int_list(args.sweep_lean, "--sweep-lean")]
        profile_rows = int_list(args.profile, "--profile")
        if args.reps <= 0 or (args.liger_reps is not None and args.liger_reps <= 0):
            raise ValueError("--reps/--liger-reps: expected a positive integer")
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("benchmarks/kernel/bench.py: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    records, checks = [], []
    for batch in batches:
        inp = make_inputs(batch, args.seq, args.hidden, args.vocab)
        tokens = batch * args.seq
        runs = [(p, args.chunk_tokens, p) for p in providers] + [(f"{p}-c{c}", c, p) for p, c in sweep]
        for provider, chunk, kind in runs:
            rec = {"provider": provider, "batch": batch, "tokens": tokens, "ms": None, "extra_peak_mib": None}
            reps = args.liger_reps or args.reps if provider == "liger" else args.reps
            rec["reps"] = reps
            make = functools.partial(loss_fn, kind, inp, args.beta, chunk)
            rec.update(timed(make, inp, reps, warmup=1 if provider == "liger" else 2))
            records.append(rec)
            print(json.dumps(rec), flush=True)
        if not args.no_check:
            try:
                checks.append({"batch": batch, "tokens": tokens, **check(inp, args.beta, args.chunk_tokens)})
            except torch.cuda.OutOfMemoryError:
                checks.append({"batch": batch, "tokens": tokens, "error": "OOM"})
            print(json.dumps(checks[-1]), flush=True)
        del inp
        torch.cuda.empty_cache()
    profiles = []
    for rows in profile_rows:
        profiles.append(profile_chunk(rows, args.hidden, args.vocab))
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in profiles[-1].items()}), flush=True)
    reps = {"default": args.reps, "liger": args.liger_reps or args.reps}
    result = {**header(argv, args), "reps": reps, "records": records, "checks": checks, "profiles": profiles}
    return finish(result, args.out, table(records))


if __name__ == "__main__":
    raise SystemExit(main())
