"""Kernel benchmark: loss + backward time and extra peak memory of each GRPO head implementation.

Run: `python -m grpo_kernels.bench --batch 8,32,64 --out kernel.json` (CUDA only), or `grpo-tui bench kernel ...`.
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
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .bench_providers import MIB, PROVIDERS, loss_fn, make_inputs


def run_step(step: Callable[[], object], inp: dict) -> None:
    """One call of a provider's `step` as it is timed: the inputs' grads cleared, then `step()` and, when it
    returns a loss, its backward."""
    inp["hidden"].grad = inp["weight"].grad = None
    out = step()
    if isinstance(out, torch.Tensor):
        out.backward()


def measure(step: Callable[[], object], inp: dict, reps: int, warmup: int = 2) -> tuple[float, float, float, dict]:
    """(median ms over `reps`, extra peak MiB, median host ms to enqueue, `state_summary` of the GPU's clock and
    power read after each rep) of `step` (+ its backward)."""
    once = functools.partial(run_step, step, inp)
    for _ in range(warmup):
        once()
    inp["hidden"].grad = inp["weight"].grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    once()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    times, host, states = [], [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        once()
        end.record()
        # Host time to enqueue everything: close to the device time means the host is the bottleneck
        host.append((time.perf_counter() - t0) * 1e3)
        end.synchronize()
        times.append(start.elapsed_time(end))
        states.append(gpu_state())  # after the rep's sync: not inside its time
    inp["hidden"].grad = inp["weight"].grad = None
    return statistics.median(times), peak, statistics.median(host), state_summary(states)


def gpu_state() -> tuple[float, float] | None:
    """The current GPU's (SM clock MHz, power W), read through NVML by torch; None where NVML cannot say."""
    try:
        return float(torch.cuda.clock_rate()), torch.cuda.power_draw() / 1e3
    except Exception:  # no NVML, no GPU, a driver without the counter: the timing stands without it
        return None


def state_summary(samples: list[tuple[float, float] | None]) -> dict:
    """{sm_mhz, power_w}: medians over a provider's reps, {} when none was read.

    An H200 running these GEMMs sits at its power limit (700 W), where the SM clock moves with the work and with
    what ran just before (1.1-1.9 GHz against 1.98 in one run: `benchmarks/results/h200-2026-12-03h/`): these say
    under which clock each provider's time was taken.
    """
    got = [s for s in samples if s is not None]
    if not got:
        return {}
    return {
        "sm_mhz": statistics.median(s[0] for s in got),
        "power_w": round(statistics.median(s[1] for s in got), 1),
    }


def check(inp: dict, beta: float, chunk_tokens: int | None) -> dict:
    """Ours (and lean) against naive (bf16 GEMM, fp32 softmax) on the same inputs."""
    out = {}
    grads = {}
    for provider in ("naive", "chunked", "chunked-lean"):
        inp["hidden"].grad = inp["weight"].grad = None
        loss = loss_fn(provider, inp, beta, chunk_tokens)()
        loss.backward()
        grads[provider] = (loss.detach().double(), inp["hidden"].grad.double(), inp["weight"].grad.double())
        inp["hidden"].grad = inp["weight"].grad = None
    ref = grads.pop("naive")
    for provider, (loss, gh, gw) in grads.items():
        out[provider] = {
            "loss_rel_err": ((loss - ref[0]).abs() / ref[0].abs()).item(),
            "grad_hidden_cos": F.cosine_similarity(gh.flatten(), ref[1].flatten(), dim=0).item(),
            "grad_weight_cos": F.cosine_similarity(gw.flatten(), ref[2].flatten(), dim=0).item(),
        }
    return out


def profile_chunk(rows: int, hidden: int, vocab: int) -> dict:
    """Device ms of each stage of one chunk of `rows` tokens (triton.testing.do_bench medians)."""
    from triton.testing import do_bench

    from . import casts, probs, triton_ops
    from .chunk_loop import addmm_acc

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


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import triton

    out = {"torch": torch.__version__, "triton": triton.__version__}
    for name, dist in (("trl", "trl"), ("liger", "liger-kernel")):
        try:
            out[name] = version(dist)
        except PackageNotFoundError:  # absent is a fine answer here
            out[name] = None
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


def cell(provider: str, record: dict | None, floor: float | None, trl: float | None) -> str:
    """One table cell: ms / extra MiB, with the ratio to the floor and (ours) the speed-up over trl;
    the error, or n/a, when the provider has no time there."""
    if record is None or record.get("ms") is None:
        return record.get("error", "n/a") if record else "n/a"
    ms = record["ms"]
    text = f"{ms:.1f} ms / {record['extra_peak_mib']:,.0f} MiB"
    if floor and provider != "floor":
        text += f" ({ms / floor:.2f}x floor"
        text += f", {trl / ms:.2f}x faster than trl)" if trl and provider.startswith("chunked") else ")"
    return text


def int_list(text: str, option: str) -> list[int]:
    """Parse "8,32,64" into positive ints; ValueError with a one-line message otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}")
    return values


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
    ap = argparse.ArgumentParser(prog="grpo-tui bench kernel", description=__doc__.splitlines()[0])
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
        from . import bench_padded

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
        print("grpo-tui bench kernel: needs a CUDA GPU (none found)", file=sys.stderr)
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


def header(argv: list[str] | None, args: argparse.Namespace) -> dict:
    """What every result file starts with: the command, the GPU, the versions and the head's shape."""
    return {
        "command": " ".join(["python -m grpo_kernels.bench", *(argv if argv is not None else sys.argv[1:])]),
        "gpu": torch.cuda.get_device_name(),
        "versions": _versions(),
        "shape": {"seq": args.seq, "hidden": args.hidden, "vocab": args.vocab, "beta": args.beta, "dtype": "bf16"},
    }


def finish(result: dict, out: str | None, markdown: str) -> int:
    """Write `result` as JSON to `out` (if given), print the markdown table last; exit status 0."""
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown)
    return 0


def timed(make_step: Callable[[], Callable[[], object]], inp: dict, reps: int, warmup: int = 2) -> dict:
    """{ms, extra_peak_mib, host_ms, sm_mhz, power_w} of the step `make_step` builds (the last two where NVML
    answers), or {error} (OOM, not installed, a failure)."""
    try:
        ms, peak, host, state = measure(make_step(), inp, reps, warmup=warmup)
        out = {"ms": ms, "extra_peak_mib": peak, "host_ms": host, **state}
    except torch.cuda.OutOfMemoryError:
        out = {"error": "OOM"}
    except ImportError as exc:
        out = {"error": f"not installed ({exc.name})"}
    except Exception as exc:  # one provider failing must not lose the others' numbers
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"}
    inp["hidden"].grad = inp["weight"].grad = None
    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
