"""Why the pass runs below copy bandwidth (call N): one 1,536-row chunk of Qwen-head logits, each run restoring
them first (copy timed alone and subtracted). Variants: the grid's order (rows fastest, today, or a row's blocks
fastest: contiguous addresses for programs in flight), the target compared in int32, and Triton baselines
(load -> exp -> store, no statistics; a plain load/store copy) in both orders. Also row_stats (scoring's pass)."""
import json
import torch
import triton.language as tl
from triton.testing import do_bench
from grpo_kernels import probs, triton_ops
from grpo_kernels.triton_ops import LOGIT_FLOOR, _floored, _jit

LOOSE = ("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr", "shift_ptr", "bad_ptr")


@_jit(loose=LOOSE)
def _var_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                WINDOW: tl.constexpr, FLOOR: tl.constexpr, SWAP: tl.constexpr, I32: tl.constexpr):
    if SWAP:
        blk = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t
    if I32:
        target = target.to(tl.int32)
    shift = z_t + LEAD
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    z = _floored(raw, FLOOR) * inv_t
    top = tl.max(z, axis=0)
    good = top - shift <= WINDOW
    ref = tl.where(good, shift, top)
    d = z - ref
    e = tl.exp(d)
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    out = row * n_blk + blk
    tl.store(part_max_ptr + out, ref)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, x)
    if good:
        tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    else:
        tl.store(bad_ptr + row, 1)
    if blk == 0:
        tl.store(target_logit_ptr + row, z_t)
        tl.store(shift_ptr + row, shift)


@_jit(loose="*_ptr")
def _exp_kernel(logits_ptr, stride, n_cols, BLOCK: tl.constexpr, SWAP: tl.constexpr, EXP: tl.constexpr):
    if SWAP:
        blk = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(logits_ptr + row * stride + cols, mask=inside, other=0.0)
    if EXP:
        raw = tl.exp(raw.to(tl.float32) - 3.0).to(raw.dtype)
    tl.store(logits_ptr + row * stride + cols, raw, mask=inside)


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
ref_out = None


def timed(name, launch, check=True):
    global ref_out
    def fn():
        tile.copy_(logits)
        launch()
    fn(); torch.cuda.synchronize()
    if check:
        got = (tile.clone(), parts.clone())
        if ref_out is None:
            ref_out = got
        res[name + "_same"] = torch.equal(got[0], ref_out[0]) and torch.equal(got[1], ref_out[1])
    res[name] = round(do_bench(fn, warmup=25, rep=200, return_mode="median") - copy, 4)


blk = 4096
nb = -(-V // blk)
common = (tile, tile.stride(0), ids, parts[0], parts[1], parts[2], tl_, sh, bad)
kw = dict(BLOCK=blk, LEAD=8.0, WINDOW=32.0, FLOOR=LOGIT_FLOOR, num_warps=8)
timed("default", lambda: probs._probs_kernel[(rows, nb)](*common, V, nb, 1.0, **kw))
for swap in (0, 1):
    for i32 in (0, 1):
        grid = (nb, rows) if swap else (rows, nb)
        timed(f"var_swap{swap}_i32{i32}", lambda grid=grid, swap=swap, i32=i32: _var_kernel[grid](*common, V, nb, 1.0, SWAP=swap, I32=i32, **kw))
for swap in (0, 1):
    for ex in (0, 1):
        grid = (nb, rows) if swap else (rows, nb)
        timed(f"base_swap{swap}_exp{ex}", lambda grid=grid, swap=swap, ex=ex: _exp_kernel[grid](tile, tile.stride(0), V, BLOCK=blk, SWAP=swap, EXP=ex, num_warps=8), check=False)
res["row_stats"] = round(do_bench(lambda: triton_ops.row_stats(logits, ids, 1.0), warmup=25, rep=200, return_mode="median"), 4)
res["read_sum"] = round(do_bench(lambda: logits.sum(dtype=torch.float32), warmup=25, rep=200, return_mode="median"), 4)
print(json.dumps(res))
times = {k: v for k, v in res.items() if not k.endswith("_same") and k != "copy_ms"}
print("copy", res["copy_ms"], " ".join(f"{k}={v}" for k, v in times.items()))
