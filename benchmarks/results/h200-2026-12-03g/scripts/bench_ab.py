"""The padded bench with one of this session's changes undone (call M): python bench_ab.py MODE <bench args>.

MODE: default | sync-first (no first chunk before the host sync) | zero-fill (dW accumulator zero-filled, every
chunk accumulates) | torch-mul (row scalings by torch's mixed-dtype mul)."""
import sys

import torch

from grpo_kernels import casts, chunk_loop, rows

mode = sys.argv[1]
if mode == "sync-first":
    init = rows.Plan.__init__

    def no_first(self, *a, **k):
        init(self, *a, **k)
        self.first = self.live = None

    rows.Plan.__init__ = no_first
elif mode == "zero-fill":
    acc_fn = chunk_loop.addmm_acc

    def zero_then_add(acc, a, b, *, first=False):
        if first:
            acc.zero_()
        acc_fn(acc, a, b)

    chunk_loop.addmm_acc = zero_then_add
elif mode == "torch-mul":
    chunk_loop.scale_rows = lambda src, scale, out: torch.mul(src, scale.unsqueeze(1), out=out)
elif mode != "default":
    raise SystemExit(f"unknown mode {mode}")
del casts
from grpo_kernels.bench import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
