"""The three GEMMs of one 1,536-row chunk at Qwen's head on the H200 (call M), and the dW accumulator's layouts:
[V, H] (tile^T @ ch, today) or [H, V] (ch^T @ tile), accumulate (beta 1) or overwrite (beta 0), fp32 or bf16 out."""
import json
import torch
from triton.testing import do_bench

H, V = 1024, 151936
g = torch.Generator(device="cuda").manual_seed(1)
res = {}
for rows in (1024, 1536, 2048, 3072):
    h = torch.randn(rows, H, device="cuda", generator=g).bfloat16()
    w = (torch.randn(V, H, device="cuda", generator=g) * 0.05).bfloat16()
    tile = (torch.rand(rows, V, device="cuda", generator=g) * 1e-3).bfloat16()
    acc = torch.zeros(V, H, device="cuda")
    acc_t = torch.zeros(H, V, device="cuda")
    out16 = torch.empty(V, H, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(rows, V, device="cuda", dtype=torch.bfloat16)
    dh = torch.empty(rows, H, device="cuda", dtype=torch.bfloat16)
    cases = {
        "logits": lambda: torch.mm(h, w.t(), out=logits),
        "dh": lambda: torch.mm(tile, w, out=dh),
        "dw_vh_fp32_acc": lambda: torch.addmm(acc, tile.t(), h, out_dtype=torch.float32, out=acc),
        "dw_vh_fp32_set": lambda: torch.mm(tile.t(), h, out_dtype=torch.float32, out=acc),
        "dw_vh_bf16_set": lambda: torch.mm(tile.t(), h, out=out16),
        "dw_hv_fp32_acc": lambda: torch.addmm(acc_t, h.t(), tile, out_dtype=torch.float32, out=acc_t),
        "dw_hv_fp32_set": lambda: torch.mm(h.t(), tile, out_dtype=torch.float32, out=acc_t),
    }
    for name, fn in cases.items():
        res[f"{rows}_{name}"] = round(do_bench(fn, warmup=25, rep=200, return_mode="median"), 4)
    del h, w, tile, acc, acc_t, out16, logits, dh
    torch.cuda.empty_cache()
print(json.dumps(res))
for rows in (1024, 1536, 2048, 3072):
    print(rows, {k.split("_", 1)[1]: v for k, v in res.items() if k.startswith(f"{rows}_")})
