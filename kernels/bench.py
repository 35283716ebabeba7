"""Kernel benchmark: loss + backward time and extra peak memory of each GRPO head implementation.

Run: `python -m grpo_kernels.bench --batch 8,32,64 --out kernel.json` (CUDA only), or `grpo-tui bench kernel ...`.
Providers: floor (the 3 GEMMs at full size), naive (materialised logits + autograd), trl (TRL 1.16's
ChunkedLogProbFunction + the GRPO loss math), liger (LigerFusedLinearGRPOLoss), chunked (ours) and
chunked-lean. "extra peak" = max_memory_allocated above what the inputs hold, gradients included.
`--variants fast_stats,fast_grad,direct_dw,fold_cast,lean_host,async_check,balanced,all,default`
also times ours with each opt-in variant of the chunk loop (see `functional.VARIANT_FLAGS`) as providers
`chunked+<variant>` ("default" again as `chunked#2`: the run-to-run spread), side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .functional import fused_linear_grpo_loss, parse_variant, use_variant
from .loss_math import per_token_loss, token_weights
from .reference import reference_grpo_loss

PROVIDERS = ("floor", "naive", "trl", "liger", "chunked", "chunked-lean")
MIB = 2**20


def make_inputs(batch: int, seq: int, hidden: int, vocab: int, seed: int = 0) -> dict:
    """bf16 GRPO inputs on CUDA with a Qwen3-0.6B-like head scale (random, never zeros)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(batch, seq, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.05).bfloat16()
    ids = torch.randint(0, vocab, (batch, seq), device="cuda", generator=g)
    mask = torch.ones(batch, seq, device="cuda", dtype=torch.int64)
    adv = torch.randn(batch, device="cuda", generator=g)
    ref = -torch.rand(batch, seq, device="cuda", generator=g) * 5 - 8  # near log(1/V)
    return dict(hidden=h.requires_grad_(), weight=w.requires_grad_(), ids=ids, mask=mask, adv=adv, ref=ref)


def _trl_fn(inp: dict, beta: float) -> Callable[[], torch.Tensor]:
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    def run() -> torch.Tensor:
        h = inp["hidden"]
        # What TRL's patched forward does: log-probs and entropy of every valid token (all are valid here)
        logps, _ent, *_ = ChunkedLogProbFunction.apply(
            h.reshape(-1, h.shape[-1]), inp["weight"], None, inp["ids"].reshape(-1), 1.0,
            _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("entropy",),
        )  # fmt: skip
        logps = logps.view(inp["ids"].shape)
        loss_tok, _ = per_token_loss(
            logps, None, inp["ref"], inp["adv"].unsqueeze(1), inp["mask"], beta=beta, epsilon_low=0.2,
            epsilon_high=0.2, importance_sampling_level="token",
        )  # fmt: skip
        w = token_weights(inp["mask"], "dapo", max_completion_length=None, num_items_in_batch=None, dtype=logps.dtype)
        return (loss_tok * w).sum()

    return run


def _liger_fn(inp: dict, beta: float) -> Callable[[], torch.Tensor]:
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    torch._dynamo.reset()  # Liger's compiled chunk fails its guards on a new shape otherwise
    mod = LigerFusedLinearGRPOLoss(beta=beta, loss_type="dapo", use_ref_model=True)

    def run() -> torch.Tensor:
        out = mod(inp["hidden"], inp["weight"], inp["ids"], inp["mask"], inp["adv"], ref_per_token_logps=inp["ref"])
        return out[0] if isinstance(out, tuple) else out

    return run


def _floor_fn(inp: dict) -> Callable[[], None]:
    h = inp["hidden"].detach().reshape(-1, inp["hidden"].shape[-1])
    w = inp["weight"].detach()

    def run() -> None:
        logits = h @ w.t()  # [N, V]
        _dh = logits @ w  # [N, H]
        _dw = logits.t() @ h  # [V, H]

    return run


def loss_fn(provider: str, inp: dict, beta: float, chunk_tokens: int | None = None) -> Callable[[], torch.Tensor]:
    """A closure computing the scalar loss of `provider` on `inp` (call .backward() on it)."""
    if provider == "trl":
        return _trl_fn(inp, beta)
    if provider == "liger":
        return _liger_fn(inp, beta)
    base, _, variant = provider.partition("+")
    base = base.split("#")[0]  # "chunked#2": the default timed again
    fn = reference_grpo_loss if base == "naive" else fused_linear_grpo_loss
    kw = {} if base == "naive" else {"chunk_tokens": chunk_tokens, "lean": base == "chunked-lean"}
    args = (inp["hidden"], inp["weight"], inp["ids"], inp["mask"], inp["adv"])
    if variant:
        parse_variant(variant)  # fail here, not inside the timed closure

        def run_variant() -> torch.Tensor:
            with use_variant(variant):
                return fn(*args, ref_logps=inp["ref"], beta=beta, loss_type="dapo", **kw)[0]

        return run_variant
    return lambda: fn(*args, ref_logps=inp["ref"], beta=beta, loss_type="dapo", **kw)[0]


def measure(step: Callable[[], object], inp: dict, reps: int, warmup: int = 2) -> tuple[float, float, float]:
    """(median ms over `reps`, extra peak MiB, median host ms to enqueue) of `step` (+ its backward)."""

    def once() -> None:
        inp["hidden"].grad = None
        inp["weight"].grad = None
        out = step()
        if isinstance(out, torch.Tensor):
            out.backward()

    for _ in range(warmup):
        once()
    inp["hidden"].grad = inp["weight"].grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    once()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    times, host = [], []
    for _ in range(reps):
        inp["hidden"].grad = inp["weight"].grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        once()
        end.record()
        # Host time to enqueue everything: close to the device time means the host is the bottleneck
        host.append((time.perf_counter() - t0) * 1e3)
        end.synchronize()
        times.append(start.elapsed_time(end))
    inp["hidden"].grad = inp["weight"].grad = None
    return statistics.median(times), peak, statistics.median(host)


def check(inp: dict, beta: float, chunk_tokens: int | None, variants: tuple[str, ...] = ()) -> dict:
    """Ours (lean, and each `chunked+<variant>`) against naive (bf16 GEMM, fp32 softmax) on the same inputs."""
    out = {}
    grads = {}
    for provider in ("naive", "chunked", "chunked-lean", *variants):
        inp["hidden"].grad = inp["weight"].grad = None
        try:
            loss = loss_fn(provider, inp, beta, chunk_tokens)()
            loss.backward()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken variant is reported, the others still checked
            out[provider] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            continue
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

    from . import triton_ops
    from .functional import _addmm_acc, _mm_into, _scaled

    g = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * 0.05).bfloat16()
    ids = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    tile = torch.empty(rows, vocab, device="cuda", dtype=torch.bfloat16)
    torch.mm(h, w.t(), out=tile)
    parts, tgt = triton_ops.row_stats(tile, ids, 1.0)
    lp, _, lse, _ = triton_ops.finish_rows(parts, tgt)
    grad_inputs = dict(old=None, ref=lp - 0.1, adv=torch.randn(rows, device="cuda"), w=torch.full_like(lp, 1 / rows),
                       beta=0.04, epsilon_low=0.2, epsilon_high=0.2)  # fmt: skip
    acc32 = torch.zeros(vocab, hidden, device="cuda")
    acc16 = torch.zeros(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    gh = torch.empty_like(h)
    gvec = torch.randn(rows, device="cuda") * 1e-3
    go = torch.ones((), device="cuda")
    stages = {
        "logits_gemm": lambda: torch.mm(h, w.t(), out=tile),
        "row_stats": lambda: triton_ops.row_stats(tile, ids, 1.0),
        # fast_stats variant, on the same logits (the stages below overwrite the tile)
        "row_stats_fast": lambda: triton_ops.row_stats(tile, ids, 1.0, fast=True),
        "finish_rows_grad": lambda: triton_ops.finish_rows(parts, tgt, grad_inputs),
        "logits_to_grad": lambda: triton_ops.logits_to_grad(tile, ids, lse, gvec, 1.0),
        "dh_gemm": lambda: torch.mm(tile, w, out=gh),
        "dw_gemm_fp32acc": lambda: _addmm_acc(acc32, tile.t(), h),
        "dw_gemm_bf16acc": lambda: _addmm_acc(acc16, tile.t(), h),
        # The variants' stages: first dW GEMM with beta = 0, the zero-fill it replaces, fast_grad
        "dw_gemm_fp32_direct": lambda: _mm_into(acc32, tile.t(), h),
        "dw_acc_zero_fill": lambda: acc32.zero_(),
        "logits_to_grad_fast": lambda: triton_ops.logits_to_grad(tile, ids, lse, gvec, 1.0, fast=True),
        # The end of a call: default = cast fp32 dW to bf16, then backward scales it in place; fold_cast = one pass
        "dw_cast_then_scale": lambda: acc32.to(torch.bfloat16).mul_(go.to(torch.bfloat16)),
        "dw_fold_cast_scale": lambda: _scaled(acc32, go, torch.bfloat16),
    }
    out = {"rows": rows}
    for name, fn in stages.items():
        try:
            out[name] = do_bench(fn, warmup=25, rep=100, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a failing variant stage must not lose the others
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
        cells = []
        for p in provs:
            r = get.get((p, b))
            if r is None or r.get("ms") is None:
                cells.append(r.get("error", "n/a") if r else "n/a")
                continue
            cell = f"{r['ms']:.1f} ms / {r['extra_peak_mib']:,.0f} MiB"
            if floor and p != "floor":
                cell += f" ({r['ms'] / floor:.2f}x floor"
                cell += f", {trl / r['ms']:.2f}x faster than trl)" if trl and p.startswith("chunked") else ")"
            cells.append(cell)
        tokens = get[next((p, b) for p in provs if (p, b) in get)]["tokens"]
        lines.append(f"| {b} ({tokens:,}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _int_list(text: str, option: str) -> list[int]:
    """Parse "8,32,64" into positive ints; ValueError with a one-line message otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option}: expected comma-separated positive integers, got {text!r}")
    return values


def _variant_providers(text: str) -> list[str]:
    """Provider names for `--variants`: "chunked+<variant>", and "chunked#k" for each repeat of "default"."""
    out: list[str] = []
    for spec in (x.strip() for x in text.split(",") if x.strip()):
        try:
            parse_variant(spec)
        except ValueError as exc:
            raise ValueError(f"--variants: {str(exc).split(': ', 1)[1]}") from None
        if spec == "default":
            out.append(f"chunked#{sum(p.startswith('chunked#') for p in out) + 2}")
        else:
            out.append(f"chunked+{spec}")
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="grpo-tui bench kernel", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="8,32,64", help="comma-separated batch sizes (sequences of --seq tokens)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--providers", default=",".join(PROVIDERS), help=f"subset of {','.join(PROVIDERS)}")
    ap.add_argument("--chunk-tokens", type=int, default=None, help="our chunk size (default by vocab)")
    ap.add_argument("--sweep-chunks", default="", help="also time ours at these chunk sizes, e.g. 512,2048")
    ap.add_argument("--sweep-lean", default="", help="also time ours lean at these chunk sizes")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--variants", default="", help="also time ours with these opt-in variants (a+b combines; "
                    "all = every flag; default = the plain one again), e.g. fast_stats,fast_grad,direct_dw,"
                    "fold_cast,lean_host,async_check,balanced,all,default")
    ap.add_argument("--liger-reps", type=int, default=None, help="reps for liger (~2 s each at 32k tokens); "
                    "default --reps")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check of ours vs naive")
    ap.add_argument("--profile", default="", help="also time each stage of one chunk at these sizes, e.g. 1024,4096")
    ap.add_argument("--out", default=None, help="write JSON results here")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # argparse already printed a one-line error
        return int(exc.code or 0)
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    bad = [p for p in providers if p not in PROVIDERS]
    if bad:
        print(f"--providers: unknown {', '.join(bad)}; allowed: {', '.join(PROVIDERS)}", file=sys.stderr)
        return 2
    try:
        batches = _int_list(args.batch, "--batch")
        sweep = [("chunked", c) for c in _int_list(args.sweep_chunks, "--sweep-chunks")]
        sweep += [("chunked-lean", c) for c in _int_list(args.sweep_lean, "--sweep-lean")]
        profile_rows = _int_list(args.profile, "--profile")
        variant_provs = _variant_providers(args.variants)
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
        runs += [(p, args.chunk_tokens, p) for p in variant_provs]
        for provider, chunk, kind in runs:
            rec = {"provider": provider, "batch": batch, "tokens": tokens, "ms": None, "extra_peak_mib": None}
            try:
                if provider == "floor":
                    step = _floor_fn(inp)
                else:
                    step = loss_fn(kind, inp, args.beta, chunk)
                reps = args.liger_reps or args.reps if provider == "liger" else args.reps
                rec["reps"] = reps
                rec["ms"], rec["extra_peak_mib"], rec["host_ms"] = measure(
                    step, inp, reps, warmup=1 if provider == "liger" else 2
                )
            except torch.cuda.OutOfMemoryError:
                rec["error"] = "OOM"
            except ImportError as exc:
                rec["error"] = f"not installed ({exc.name})"
            except Exception as exc:  # noqa: BLE001 - one provider failing must not lose the others' numbers
                rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            inp["hidden"].grad = inp["weight"].grad = None
            torch.cuda.empty_cache()
            records.append(rec)
            print(json.dumps(rec), flush=True)
        if not args.no_check:
            try:
                checked = tuple(p for p in variant_provs if "+" in p)
                checks.append({"batch": batch, "tokens": tokens, **check(inp, args.beta, args.chunk_tokens, checked)})
            except torch.cuda.OutOfMemoryError:
                checks.append({"batch": batch, "tokens": tokens, "error": "OOM"})
            print(json.dumps(checks[-1]), flush=True)
        del inp
        torch.cuda.empty_cache()
    profiles = []
    for rows in profile_rows:
        profiles.append(profile_chunk(rows, args.hidden, args.vocab))
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in profiles[-1].items()}), flush=True)
    result = {
        "command": " ".join(["python -m grpo_kernels.bench", *(argv if argv is not None else sys.argv[1:])]),
        "gpu": torch.cuda.get_device_name(),
        "versions": _versions(),
        "reps": {"default": args.reps, "liger": args.liger_reps or args.reps},
        "variants": {p: p.partition("+")[2] or "default (repeat)" for p in variant_provs},
        "shape": {"seq": args.seq, "hidden": args.hidden, "vocab": args.vocab, "beta": args.beta, "dtype": "bf16"},
        "records": records,
        "checks": checks,
        "profiles": profiles,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
