"""probs_pass geometry on the H200 (call L): one 1,536-row chunk of Qwen-head logits, each run restoring them
first (copy timed alone and subtracted). BLOCK 2048/4096/8192 x 4/8/16 warps; and, for scale, the same pass
without its max and branch (every block converted: not correct for far targets, an upper bound of what the
max costs)."""
import json
import torch
import triton.language as tl
from triton.testing import do_bench
from grpo_kernels import probs
from grpo_kernels.triton_ops import LOGIT_FLOOR, _jit


@_jit(loose=("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr", "shift_ptr", "bad_ptr"))
def _nobranch_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                     shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                     WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    shift = tl.load(row_ptr + target).to(tl.float32) * inv_t + LEAD
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    d = tl.maximum(raw.to(tl.float32), FLOOR) * inv_t - shift
    e = tl.exp(d)
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    out = row * n_blk + blk
    tl.store(part_max_ptr + out, shift)
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
parts = torch.empty(3, rows, V // 2048 + 1, device="cuda")
tl_, sh = torch.empty(2, rows, device="cuda")
copy = do_bench(lambda: tile.copy_(logits), warmup=25, rep=200, return_mode="median")
res = {"copy_ms": round(copy, 4)}


def timed(kernel, block, warps):
    n_blk = -(-V // block)

    def fn():
        tile.copy_(logits)
        kernel[(rows, n_blk)](tile, tile.stride(0), ids, parts[0], parts[1], parts[2], tl_, sh, bad, V, n_blk, 1.0,
                              BLOCK=block, LEAD=8.0, WINDOW=32.0, FLOOR=LOGIT_FLOOR, num_warps=warps)
    return round(do_bench(fn, warmup=25, rep=200, return_mode="median") - copy, 4)


for block in (2048, 4096, 8192):
    for warps in (4, 8, 16):
        res[f"pass_b{block}_w{warps}"] = timed(probs._probs_kernel, block, warps)
res["nobranch_b4096_w8"] = timed(_nobranch_kernel, 4096, 8)
print(json.dumps(res))
best = min((k for k in res if k.startswith("pass_")), key=res.get)
print("best", best, res[best], "default b4096_w8", res["pass_b4096_w8"], "no max/branch", res["nobranch_b4096_w8"])
