"""grpo_kernels.decode_attention: one query per row over a static KV cache, against sdpa with repeated heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grpo_kernels import decode_attention as da
from grpo_kernels import triton_ops

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.fixture(params=["torch", "triton"])
def kernel_backend(request, monkeypatch):
    """The torch twin, or the Triton kernel under the interpreter (tests/gpu run it compiled)."""
    if request.param == "triton":
        if not triton_ops.HAS_TRITON or torch.cuda.is_available():
            pytest.skip("CUDA present: tests/gpu run the compiled kernel")
        from triton.runtime.interpreter import InterpretedFunction

        kernel = da._decode_attention_kernel
        if not isinstance(kernel, InterpretedFunction):  # decorated before TRITON_INTERPRET was set
            monkeypatch.setattr(da, "_decode_attention_kernel", InterpretedFunction(kernel.fn))
        monkeypatch.setattr(da, "BLOCK_KEYS", 8)  # small blocks: the test caches cross many of them
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", request.param)
    return request.param


def cache_mask(rows: int, length: int, starts: list[int], end: int) -> torch.Tensor:
    """[R, L]: row r may attend to slots starts[r] .. end-1 (left padding before, unwritten slots after)."""
    index = torch.arange(length)
    return (index[None, :] >= torch.tensor(starts)[:, None]) & (index[None, :] < end)


def reference(query, key, value, mask, scale):
    group = query.shape[1] // key.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (key, value))  # transformers' repeat_kv order
    out = F.scaled_dot_product_attention(query.double(), k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.transpose(1, 2)  # [R, 1, H, D]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 2)])
def test_matches_sdpa_with_repeated_heads(kernel_backend, dtype, heads, kv_heads) -> None:
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    rows, length, dim = 5, 40, 16
    query = torch.randn(rows, heads, 1, dim, generator=g).to(dtype)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=g).to(dtype) for _ in range(2))
    # Left padding of several widths (one row padded past a whole block), slots after 29 not yet written,
    # and a row allowed a single key.
    mask = cache_mask(rows, length, [0, 3, 12, 28, 0], 29)
    mask[4] = False
    mask[4, 17] = True
    scale = dim**-0.5
    got = da.decode_attention(query, key, value, mask, scale)
    assert got.shape == (rows, 1, heads, dim) and got.dtype == dtype
    torch.testing.assert_close(got.double(), reference(query, key, value, mask, scale), rtol=0, atol=TOL[dtype])


def test_slots_the_mask_rules_out_are_never_read(kernel_backend) -> None:
    rows, length, dim = 3, 48, 8
    query = torch.randn(rows, 2, 1, dim)
    key, value = torch.randn(rows, 1, length, dim), torch.randn(rows, 1, length, dim)
    mask = cache_mask(rows, length, [4, 0, 9], 30)
    expected = da.decode_attention(query, key, value, mask)
    key[~mask[:, None, :].expand_as(key[..., 0])] = float("nan")  # padding and unwritten slots hold garbage
    value[~mask[:, None, :].expand_as(value[..., 0])] = float("nan")
    torch.testing.assert_close(da.decode_attention(query, key, value, mask), expected)


def test_query_not_contiguous_in_heads(kernel_backend) -> None:
    # transformers hands the query as a transposed view [R, H, 1, D] of [R, 1, H, D]
    rows, heads, dim, length = 2, 4, 8, 16
    query = torch.randn(rows, 1, heads, dim).transpose(1, 2)
    key, value = torch.randn(rows, 2, length, dim), torch.randn(rows, 2, length, dim)
    mask = cache_mask(rows, length, [0, 5], 12)
    torch.testing.assert_close(
        da.decode_attention(query, key, value, mask).double(), reference(query, key, value, mask, dim**-0.5)
    )


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "mask_shape", "words"),
    [
        ((2, 4, 3, 8), (2, 2, 16, 8), (2, 16), "query [R, H, 1, D]"),
        ((2, 3, 1, 8), (2, 2, 16, 8), (2, 16), "query [R, H, 1, D]"),
        ((2, 4, 1, 8), (2, 2, 16, 8), (2, 15), "bool mask [R, L]"),
        ((2, 4, 1, 12), (2, 2, 16, 12), (2, 16), "power of two"),
    ],
)
def test_bad_shapes_are_one_line(q_shape, kv_shape, mask_shape, words) -> None:
    query, key = torch.randn(q_shape), torch.randn(kv_shape)
    with pytest.raises(ValueError, match="decode_attention") as error:
        da.decode_attention(query, key, key.clone(), torch.ones(mask_shape, dtype=torch.bool))
    assert words in str(error.value) and "\n" not in str(error.value)
