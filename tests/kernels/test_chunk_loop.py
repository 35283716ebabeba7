"""`chunk_loop.addmm_acc`: the dW accumulator's GEMMs."""

from __future__ import annotations

import torch

from grpo_kernels import chunk_loop


def test_first_dw_gemm_overwrites_the_accumulator():
    # The first chunk's dW GEMM writes the accumulator (beta = 0) instead of adding to a zero-filled one: its
    # old contents are never read; later chunks add to it
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(7, 5, generator=g), torch.randn(5, 4, generator=g)
    for dtype in (torch.float32, torch.float16):
        acc = torch.full((7, 4), float("nan"))
        chunk_loop.addmm_acc(acc, a.to(dtype), b.to(dtype), first=True)
        want = a.to(dtype).float() @ b.to(dtype).float()
        torch.testing.assert_close(acc, want)
        chunk_loop.addmm_acc(acc, a.to(dtype), b.to(dtype))
        torch.testing.assert_close(acc, 2 * want)
