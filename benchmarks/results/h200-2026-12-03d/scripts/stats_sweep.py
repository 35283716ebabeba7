"""row_stats geometry sweep on the H200: one chunk of logits [rows, 151936] bf16, each (segment, block) with a fresh
autotune over warps; ms per call and TB/s of the logits read. Checked against the default geometry's output."""
import json, sys
import torch, triton
import grpo_kernels.triton_ops as T

rows, vocab = int(sys.argv[1]), 151936
logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 3
targets = torch.randint(0, vocab, (rows,), device="cuda")
ref = T.logprob_stats(logits, targets, 1.0)
out = []
for seg, block in [(4096, 4096), (8192, 4096), (16384, 4096), (8192, 2048), (4096, 2048), (2048, 2048), (16384, 8192), (8192, 8192)]:
    n_seg = -(-vocab // seg)
    tuned = triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])(T._row_stats_kernel)
    parts = torch.empty((3, rows, n_seg), device="cuda")
    tl_ = torch.empty((rows,), device="cuda")
    args = (logits, logits.stride(0), targets, parts[0], parts[1], parts[2], tl_, vocab, n_seg, 1.0)
    run = lambda: tuned[(rows, n_seg)](*args, SEG=seg, BLOCK=block, FLOOR=T.LOGIT_FLOOR)
    run(); torch.cuda.synchronize()
    lp, ent, lse, _ = T.finish_rows(parts, tl_)
    err = max((lp - ref[0]).abs().max().item(), (ent - ref[1]).abs().max().item())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            run()
    g.replay(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); 
    for _ in range(5): g.replay()
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / 50
    row = dict(rows=rows, seg=seg, block=block, warps=tuned.best_config.num_warps, ms=round(ms, 4), tb_s=round(rows * vocab * 2 / ms / 1e9, 3), max_err=err)
    out.append(row); print(json.dumps(row), flush=True)
sys.path.insert(0, ".scratch")
import old_row_stats
old = triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])(old_row_stats._row_stats_kernel)
n_seg = -(-vocab // 4096)
parts = torch.empty((3, rows, n_seg), device="cuda"); tl_ = torch.empty((rows,), device="cuda")
args = (logits, logits.stride(0), targets, parts[0], parts[1], parts[2], tl_, vocab, n_seg, 1.0)
run = lambda: old[(rows, n_seg)](*args, SEG=4096, BLOCK=4096)
run(); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(10):
        run()
g.replay(); torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(5): g.replay()
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 50
row = dict(rows=rows, seg=4096, block=4096, kernel="before 9dee75e", warps=old.best_config.num_warps, ms=round(ms, 4), tb_s=round(rows * vocab * 2 / ms / 1e9, 3))
out.append(row); print(json.dumps(row), flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=1)
