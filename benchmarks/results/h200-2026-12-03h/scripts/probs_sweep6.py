"""The pass's bytes in flight (call T, eighth session). One 1,536-row chunk of Qwen-head logits, the tile copied
back before each launch and the copy's time subtracted (as probs_sweep4/5). Variants of the committed kernel:
  rawfirst   the block's load issued before the target -> target logit chain (same signature: patchable)
  given      the target logit and M gathered by torch first; the pass reads M (no dependent load chain)
  two        two neighbouring blocks per program, both loads issued first
  b{B}w{W}   the committed kernel at other geometries; maxnreg{R}: with a register cap (more programs per SM)
  ls_b{B}w{W} a Triton load + store back only; torch_exp_: torch's in-place exp of the tile (in-place streaming)
Each compiled kernel's registers per thread are recorded (n_regs)."""
import json
import torch
import triton.language as tl
from triton.testing import do_bench
from grpo_kernels import probs
from grpo_kernels.triton_ops import LOGIT_FLOOR, floored, jit

from pass_variants import _given_kernel, _ls_kernel, _opt_kernel, _rawfirst_kernel, _two_kernel

import os
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu":  # a syntax and equality check under TRITON_INTERPRET=1
    do_bench = lambda fn, **k: (fn(), 0.0)[1]  # noqa: E731
DT = torch.bfloat16 if DEV == "cuda" else torch.float32
rows, H, V = (1536, 1024, 151936) if DEV == "cuda" else (4, 64, 5000)
g = torch.Generator(device=DEV).manual_seed(1)
h = torch.randn(rows, H, device=DEV, generator=g).to(DT)
w = (torch.randn(V, H, device=DEV, generator=g) * 0.05).to(DT)
ids = torch.randint(0, V, (rows,), device=DEV, generator=g)
logits = h @ w.t()
tile = torch.empty_like(logits)
bad = torch.zeros(rows, device=DEV, dtype=torch.int32)
res = {}
copy = do_bench(lambda: tile.copy_(logits), warmup=25, rep=300, return_mode="median")
res["copy_ms"] = round(copy, 4)
base = dict(LEAD=8.0, WINDOW=32.0, FLOOR=LOGIT_FLOOR)
refs = {}


def bufs(block):
    nb = -(-V // block)
    return nb, torch.empty(3, rows, nb, device=DEV), torch.empty(2, rows, device=DEV)


def timed(name, launch, block=None, parts=None):
    def fn():
        tile.copy_(logits)
        return launch()
    try:
        k = fn()
        if DEV == "cuda":
            torch.cuda.synchronize()
    except Exception as error:  # a variant that does not compile or launch: recorded, not fatal
        res[name] = f"error: {type(error).__name__}: {str(error)[:160]}"
        print(name, res[name], flush=True)
        return
    res[name + "_regs"] = getattr(k, "n_regs", None)
    res[name + "_spills"] = getattr(k, "n_spills", None)
    if block is not None:
        got = (tile.clone(), parts.clone())
        if block not in refs:
            refs[block] = got
        res[name + "_same"] = torch.equal(got[0], refs[block][0]) and torch.equal(got[1], refs[block][1])
    res[name] = round(do_bench(fn, warmup=25, rep=300, return_mode="median") - copy, 4)
    print(name, res[name], res[name + "_regs"], res.get(name + "_same"), flush=True)


for b, wp in ((2048, 4), (1024, 2)):
    nb, parts, ts = bufs(b)
    common = (tile, tile.stride(0), ids, parts[0], parts[1], parts[2], ts[0], ts[1], bad)
    npair = -(-nb // 2)
    for reg in (None, 48, 56, 64):
        kw = {} if reg is None else {"maxnreg": reg}
        tag = "" if reg is None else f"_r{reg}"
        timed(f"b{b}w{wp}{tag}", lambda b=b, wp=wp, nb=nb, common=common, kw=kw: probs._probs_kernel[(rows * nb,)](
            *common, V, nb, 1.0, BLOCK=b, num_warps=wp, **kw, **base), b, parts)
        timed(f"opt_b{b}w{wp}{tag}", lambda b=b, wp=wp, nb=nb, common=common, kw=kw: _opt_kernel[(rows * nb,)](
            *common, V, nb, 1.0, BLOCK=b, num_warps=wp, **kw, **base), b, parts)
        timed(f"two_b{b}w{wp}{tag}", lambda b=b, wp=wp, nb=nb, common=common, npair=npair, kw=kw: _two_kernel[(rows * npair,)](
            *common, V, nb, npair, 1.0, BLOCK=b, num_warps=wp, **kw, **base), b, parts)
for b, wp in ((512, 1), (1024, 1), (4096, 8), (4096, 4)):
    nb, parts, ts = bufs(b)
    common = (tile, tile.stride(0), ids, parts[0], parts[1], parts[2], ts[0], ts[1], bad)
    for reg in (None, 48):
        kw = {} if reg is None else {"maxnreg": reg}
        tag = "" if reg is None else f"_r{reg}"
        timed(f"opt_b{b}w{wp}{tag}", lambda b=b, wp=wp, nb=nb, common=common, kw=kw: _opt_kernel[(rows * nb,)](
            *common, V, nb, 1.0, BLOCK=b, num_warps=wp, **kw, **base), b, parts)
timed("torch_exp_", lambda: tile.exp_())
print(json.dumps(res))
print("copy", res["copy_ms"], " ".join(f"{k}={v}" for k, v in res.items() if not k.endswith(("_same", "_regs", "_spills")) and k != "copy_ms"))
