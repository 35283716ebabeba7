"""probs_pass on the H200: one 1,536-row chunk of Qwen-head logits [1536, 151936] bf16. Each timed run first
restores the logits (a copy, timed alone too). The pass at 4/8/16 warps, the old masked-store variant, the repair
launch with nothing to repair, and row_stats (read only) for scale."""
import json
import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from grpo_kernels import probs, triton_ops
from grpo_kernels.triton_ops import LOGIT_FLOOR, _load_floored, _jit


@_jit(loose=("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr", "shift_ptr", "bad_ptr"))
def _masked_store_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                         shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                         WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    # the first version (call I): the target column kept raw by a store mask
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t
    shift = z_t + LEAD
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    z = _load_floored(row_ptr + cols, cols < n_cols, FLOOR) * inv_t
    top = tl.max(z, axis=0)
    out = row * n_blk + blk
    if top - shift <= WINDOW:
        d = z - shift
        e = tl.exp(d)
        s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
        tl.store(row_ptr + cols, e.to(logits_ptr.dtype.element_ty), mask=(cols < n_cols) & (cols != target))
        tl.store(part_max_ptr + out, shift)
    else:
        d = z - top
        e = tl.exp(d)
        s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
        tl.store(part_max_ptr + out, top)
        tl.store(bad_ptr + row, 1)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, x)


rows, H, V = 1536, 1024, 151936
g = torch.Generator(device="cuda").manual_seed(1)
h = torch.randn(rows, H, device="cuda", generator=g).bfloat16()
w = (torch.randn(V, H, device="cuda", generator=g) * 0.05).bfloat16()
ids = torch.randint(0, V, (rows,), device="cuda", generator=g)
logits = h @ w.t()
tile = torch.empty_like(logits)
bad = torch.zeros(rows, device="cuda", dtype=torch.int32)
n_blk = -(-V // 4096)
parts = torch.empty(3, rows, n_blk, device="cuda")
tl_, sh = torch.empty(2, rows, device="cuda")
gb = 2 * logits.numel() * 2 / 1e9  # bytes read + written by a pass, GB


def run_pass(kernel, warps):
    def fn():
        tile.copy_(logits)
        kernel[(rows, n_blk)](tile, tile.stride(0), ids, parts[0], parts[1], parts[2], tl_, sh, bad, V, n_blk, 1.0,
                              BLOCK=4096, LEAD=8.0, WINDOW=32.0, FLOOR=LOGIT_FLOOR, num_warps=warps)
    return fn


res = {"copy": do_bench(lambda: tile.copy_(logits), warmup=25, rep=200, return_mode="median")}
for warps in (4, 8, 16):
    res[f"pass_w{warps}"] = do_bench(run_pass(probs._probs_kernel, warps), warmup=25, rep=200, return_mode="median")
res["masked_store_w8"] = do_bench(run_pass(_masked_store_kernel, 8), warmup=25, rep=200, return_mode="median")
res["whole_probs_pass"] = do_bench(lambda: probs.probs_pass(tile.copy_(logits), ids, 1.0, bad), warmup=25, rep=200,
                                   return_mode="median")
res["row_stats"] = do_bench(lambda: triton_ops.row_stats(logits, ids, 1.0), warmup=25, rep=200, return_mode="median")
res["repair_noop"] = do_bench(lambda: probs._repair_kernel[(rows,)](tile, tile.stride(0), ids, parts[0], sh, bad, V, n_blk, 1.0,
                              BLOCK=4096, BLKS=64, FLOOR=LOGIT_FLOOR), warmup=25, rep=200, return_mode="median")
out = {}
for k, ms in res.items():
    net = ms - res["copy"] if k not in ("copy", "row_stats", "repair_noop") else ms
    out[k] = {"ms": round(ms, 4), "net_ms": round(net, 4)}
    if k.startswith("pass") or k.startswith("masked") or k == "whole_probs_pass":
        out[k]["net_TBps"] = round(gb / net / 1e3, 2)
print(json.dumps(out))
for k, v in out.items():
    print(f"{k:20s} {v}")
