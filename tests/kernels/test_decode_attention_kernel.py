"""grpo_kernels.decode_attention: one query per row over a static KV cache, against sdpa with repeated heads.

The Triton backend runs under the interpreter with blocks and splits shrunk (16-key blocks, splits of at least
32 keys, as many as allowed), so the small caches here cross several splits and blocks per split.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from seeds import next_seed  # tests/ is on sys.path (its conftest.py)

from grpo_kernels import decode_attention as da

# fp32: the same sums in another order; fp16: the kernel multiplies fp16 probabilities by fp16 values (as
# flash attention does) and rounds the output to fp16, ~1e-3 of an output of magnitude ~1
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
LENGTH = 100  # 3 splits of 48 keys in the shrunk geometry: not a multiple of the split size


@pytest.fixture(
    params=[(1024, 32), (32, 32), (1024, 1 << 20)],
    ids=["mask-in-one-load", "mask-looped", "one-split"],
)
def kernel_backend(backend, monkeypatch, request):
    """The torch twin, or the Triton kernels under the interpreter with small blocks and many splits, reading
    a row's mask for its loop bounds in one load, or in a loop of 32-slot loads as a long cache reads it; or one
    split per row, which writes the output without the merge."""
    mask_block, min_split = request.param
    if backend == "torch" and (mask_block != 1024 or min_split != 32):
        pytest.skip("HOIST_MASK_BLOCK and the split size are settings of the Triton kernel only")
    if backend == "triton":
        monkeypatch.setattr(da, "BLOCK_KEYS", 16)
        monkeypatch.setattr(da, "MIN_SPLIT_KEYS", min_split)
        monkeypatch.setattr(da, "TARGET_PROGRAMS", 1 << 20)
        monkeypatch.setattr(da, "HOIST_MASK_BLOCK", mask_block)
    return backend


def cache_mask(length: int, starts: list[int], end: int) -> torch.Tensor:
    """[R, L]: row r may attend to slots starts[r] .. end-1 (left padding before, unwritten slots after)."""
    index = torch.arange(length)
    return (index[None, :] >= torch.tensor(starts)[:, None]) & (index[None, :] < end)


def decode_mask() -> torch.Tensor:
    # Left padding of several widths, slots from 90 on not yet written (the last split of every row is empty);
    # row 3 starts at 50, so its first split is ruled out entirely; row 4 is allowed a single key.
    mask = cache_mask(LENGTH, [0, 3, 21, 50, 0], 90)
    mask[4] = False
    mask[4, 17] = True
    return mask


def reference(query, key, value, mask, scale):
    group = query.shape[1] // key.shape[1]
    ruled_out = ~mask[:, None, :, None]
    k, v = (t.double().masked_fill(ruled_out, 0).repeat_interleave(group, dim=1) for t in (key, value))  # repeat_kv
    out = F.scaled_dot_product_attention(query.double(), k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.transpose(1, 2)  # [R, 1, H, D]


def inputs(rows, heads, kv_heads, length, dim, dtype):
    g = torch.Generator().manual_seed(next_seed())
    query = torch.randn(rows, heads, 1, dim, generator=g).to(dtype)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=g).to(dtype) for _ in range(2))
    return query, key, value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 2)])  # groups 1, 2, 4
def test_matches_sdpa_with_repeated_heads(kernel_backend, dtype, heads, kv_heads) -> None:
    query, key, value = inputs(5, heads, kv_heads, LENGTH, 16, dtype)
    mask = decode_mask()
    scale = 0.3
    got = da.decode_attention(query, key, value, mask, scale)
    assert got.shape == (5, 1, heads, 16) and got.dtype == dtype
    torch.testing.assert_close(got.double(), reference(query, key, value, mask, scale), rtol=0, atol=TOL[dtype])
    twin = da.decode_attention_torch(query, key, value, mask, scale)
    torch.testing.assert_close(got.double(), twin.double(), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_slots_the_mask_rules_out_never_reach_the_output(kernel_backend, dtype) -> None:
    query, key, value = inputs(5, 4, 2, LENGTH, 16, dtype)
    mask = decode_mask()
    ruled_out = ~mask[:, None, :, None]
    zeros = da.decode_attention(query, key.masked_fill(ruled_out, 0), value.masked_fill(ruled_out, 0), mask)
    nan = da.decode_attention(
        query, key.masked_fill(ruled_out, torch.nan), value.masked_fill(ruled_out, torch.nan), mask
    )
    assert not nan.isnan().any()
    torch.testing.assert_close(nan, zeros, rtol=0, atol=0)


def test_strided_cache_and_query(kernel_backend) -> None:
    # A slice of a larger cache (more slots, every other head, a wider last dim) and the query as transformers
    # hands it: a transposed view [R, H, 1, D] of [R, 1, H, D]
    rows, heads, kv_heads, length, dim = 3, 4, 2, 64, 32
    g = torch.Generator().manual_seed(next_seed())
    big_key, big_value = (torch.randn(rows, 2 * kv_heads, length + 40, dim + 8, generator=g) for _ in range(2))
    key, value = big_key[:, ::2, :length, :dim], big_value[:, 1::2, 5 : 5 + length, 8:]
    query = torch.randn(rows, 1, heads, dim, generator=g).transpose(1, 2)
    mask = cache_mask(length, [0, 7, 40], 60)
    got = da.decode_attention(query, key, value, mask)
    expected = reference(query, key.contiguous(), value.contiguous(), mask, dim**-0.5)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=TOL[torch.float32])


def test_split_rule_fills_the_gpu_with_whole_blocks() -> None:
    # The Qwen3-0.6B decode shape: 128 rows x 8 kv heads over 512 slots -> 2 splits of 256 keys (4 blocks)
    assert da.split_geometry(128 * 8, 512) == (256, 2)
    for programs, length in [(8, 512), (1024, 384), (40, 192), (8192, 1024), (3, 100)]:
        split_keys, splits = da.split_geometry(programs, length)
        assert split_keys % da.BLOCK_KEYS == 0 and (splits - 1) * split_keys < length <= splits * split_keys
        most = max(1, length // da.MIN_SPLIT_KEYS)  # no split shorter than MIN_SPLIT_KEYS
        assert splits <= most and (programs * splits >= da.TARGET_PROGRAMS or splits == most)


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "mask_shape", "mask_dtype", "words"),
    [
        ((2, 4, 3, 16), (2, 2, 16, 16), (2, 16), torch.bool, "query [R, H, 1, D]"),
        ((2, 3, 1, 16), (2, 2, 16, 16), (2, 16), torch.bool, "query [R, H, 1, D]"),
        ((2, 4, 16), (2, 2, 16, 16), (2, 16), torch.bool, "query [R, H, 1, D]"),
        ((2, 4, 1, 16), (2, 2, 16, 16), (2, 15), torch.bool, "bool mask [R, L]"),
        ((2, 4, 1, 16), (2, 2, 16, 16), (2, 1, 1, 16), torch.bool, "bool mask [R, L]"),
        ((2, 4, 1, 16), (2, 2, 16, 16), (2, 16), torch.float32, "bool mask [R, L]"),
        ((2, 4, 1, 12), (2, 2, 16, 12), (2, 16), torch.bool, "power of two"),
        ((2, 4, 1, 8), (2, 2, 16, 8), (2, 16), torch.bool, "power of two"),
    ],
)
def test_bad_inputs_are_one_line(q_shape, kv_shape, mask_shape, mask_dtype, words) -> None:
    query, key = torch.randn(q_shape), torch.randn(kv_shape)
    with pytest.raises(ValueError, match="decode_attention") as error:
        da.decode_attention(query, key, key.clone(), torch.ones(mask_shape, dtype=mask_dtype))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_mixed_dtypes_are_one_line() -> None:
    query, key = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 16, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="one dtype for query/key/value") as error:
        da.decode_attention(query, key, key.clone(), torch.ones(2, 16, dtype=torch.bool))
    assert "\n" not in str(error.value)


def test_custom_op_registration_is_consistent() -> None:
    # torch.compile sees the op through its fake (shapes, dtype, strides); opcheck holds the fake to the real op
    query, key, value = inputs(3, 4, 2, 64, 16, torch.float32)
    mask = cache_mask(64, [0, 7, 40], 60)
    torch.library.opcheck(torch.ops.grpo_kernels.decode_attention.default, (query, key, value, mask, 0.25))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_hole_of_whole_blocks_inside_the_allowed_range(kernel_backend, dtype) -> None:
    # Slots 20-69 ruled out between two allowed runs: with hoisted bounds the split starting at 48 meets a whole
    # block of them before any allowed key (its running max still -inf), which must give 0 weight, not NaN
    query, key, value = inputs(2, 4, 2, LENGTH, 16, dtype)
    mask = cache_mask(LENGTH, [5, 0], 90)
    mask[0, 20:70] = False
    key[0, :, 20:70] = float("nan")  # never read
    got = da.decode_attention(query, key, value, mask, 0.3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(query, key, value, mask, 0.3), rtol=0, atol=TOL[dtype])
