"""Scaling passes with one rounding: the backward's grad_output x an fp32 accumulator, and the chunk loop's rows.

`scaled_cast`: the backward's one pass over dW, grad_output times an fp32 accumulator, written in the leaf's dtype.

torch runs `torch.mul(acc, grad_output, out=<bf16>)` as its generic elementwise kernel (a 0-dim CUDA operand and a
cast on the store: no vectorised path), ~1.3 TB/s on an H200: 0.70 ms per call over Qwen's 152k x 1024 head, a
fixed cost whatever the token count. This kernel streams the same pass, with the same rounding (the fp32 product
rounded to nearest-even once), at copy bandwidth.

Times in this file's comments: one chunk's stages, `benchmarks/kernel/bench.py --profile` on an H200, and
the loss per call, `benchmarks/kernel/bench.py` (results in `benchmarks/results/kernel-*`).
"""

from __future__ import annotations

import torch

from . import triton_ops
from .triton_ops import HAS_TRITON, jit

if HAS_TRITON:
    import triton.language as tl

# Elements per program
CAST_BLOCK = 4096
# Columns per program of `scale_rows` (a row of Qwen3-0.6B's hidden size in one program)
ROWS_BLOCK = 1024


@jit(loose=("scale_ptr",))
def _scaled_cast_kernel(src_ptr, scale_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    product = tl.load(src_ptr + offs, mask=keep, other=0.0) * tl.load(scale_ptr).to(tl.float32)
    tl.store(dst_ptr + offs, product.to(dst_ptr.dtype.element_ty), mask=keep)


def scaled_cast(src: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor of `dtype`: src * scale, for an fp32 `src` and a one-element `scale` (grad_output)."""
    out = torch.empty_like(src, dtype=dtype)
    fits = src.dtype == torch.float32 and src.is_contiguous() and scale.numel() == 1 and scale.device == src.device
    if not (fits and triton_ops.use_triton(src.device)):
        return torch.mul(src, scale, out=out)
    n = src.numel()
    _scaled_cast_kernel[(-(-n // CAST_BLOCK),)](src, scale, out, n, BLOCK=CAST_BLOCK, num_warps=8)
    return out


@jit(loose="*_ptr", loose_ints=("n_cols",))
def _scale_rows_kernel(src_ptr, src_stride, scale_ptr, dst_ptr, dst_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n_cols
    x = tl.load(src_ptr + row * src_stride + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(dst_ptr + row * dst_stride + cols, (x * tl.load(scale_ptr + row)).to(dst_ptr.dtype.element_ty), mask=keep)


def scale_rows(src: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = src * scale[:, None] ([n, H] by [n]; out may be src): the fp32 product rounded once to out's dtype.

    The chunk loop's per-row gradient scale c on the small side of its GEMMs (c * h_c, c * (tile @ W)). torch's
    `mul` of a bf16 [n, H] by an fp32 column takes its generic elementwise kernel (mixed dtypes: 8-13 us per
    1,536 x 1,024 rows on an H200, 44 launches in a 32k-token call); this is one streaming pass, bit for bit the
    same result.
    """
    fits = (
        scale.dtype == torch.float32
        and src.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and out.dtype == src.dtype
        and src.stride(-1) == out.stride(-1) == 1
        and scale.is_contiguous()
    )
    if not (fits and triton_ops.use_triton(src.device)):
        return torch.mul(src, scale.unsqueeze(1), out=out)
    n, width = src.shape
    if n:
        grid = (n, -(-width // ROWS_BLOCK))
        _scale_rows_kernel[grid](src, src.stride(0), scale, out, out.stride(0), width, BLOCK=ROWS_BLOCK, num_warps=4)
    return out
