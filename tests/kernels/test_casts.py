"""`casts`: the backward's write of grad_output x the fp32 accumulator, and the chunk loop's row scaling, bit for
bit torch's."""

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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_scale_rows_rounds_like_torch(backend, monkeypatch, dtype, in_place):
    # out = src * c[:, None]: the fp32 product rounded once, as torch's mixed-dtype mul; rows wider than a
    # program (two column blocks and a partial one) and a strided source (a view of a wider buffer)
    monkeypatch.setattr(casts, "ROWS_BLOCK", 16)
    g = torch.Generator().manual_seed(5)
    wide = (torch.randn(9, 40, generator=g) * 30).to(dtype)
    src = wide[:, :37]
    scale = torch.randn(9, generator=g) * torch.logspace(-6, 4, 9)
    scale[0] = 0.0  # a dead row: exact zeros
    src[1, :3] = torch.tensor([0.0, -0.0, 6e4]).to(dtype)
    want = torch.mul(src, scale.unsqueeze(1), out=torch.empty_like(src))
    out = src if in_place else torch.empty_like(src)
    got = casts.scale_rows(src, scale, out)
    assert got.data_ptr() == out.data_ptr()
    bits = torch.int16 if dtype == torch.float16 else torch.int32
    assert torch.equal(got.contiguous().view(bits), want.view(bits))
    assert torch.equal(
        wide[:, 37:], (torch.randn(9, 40, generator=torch.Generator().manual_seed(5)) * 30).to(dtype)[:, 37:]
    )
