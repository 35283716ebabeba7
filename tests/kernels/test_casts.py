"""`casts.scaled_cast`: the backward's write of grad_output x the fp32 accumulator, bit for bit torch's."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import casts


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, -2.5, 3e-5])
def test_scaled_cast_rounds_like_torch(backend, dtype, scale):
    if backend == "triton" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter truncates to bf16 where the GPU rounds: tests/gpu covers bf16")
    g = torch.Generator().manual_seed(4)
    src = torch.randn(37, 29, generator=g) * 10  # 1,073 elements: 16 whole shrunk blocks and a partial one
    src[0, :4] = torch.tensor([0.0, -0.0, 1e-30, 6e4])  # a zero of each sign, an fp16 underflow, near fp16's max
    want = torch.mul(src, torch.tensor(scale), out=torch.empty_like(src, dtype=dtype))
    got = casts.scaled_cast(src, torch.tensor(scale), dtype)
    assert got.dtype == dtype and got.shape == src.shape
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # bit for bit, the signs of zeros too
