"""Which buffers are alive together: the peak memory of a call, checked on CPU without a GPU allocator.

The loss path's peak is the fp32 dW accumulator plus the [C, V] chunk buffer. The loss's backward writes the
accumulator, scaled by grad_output, into the weight's dtype (a weight-sized tensor); if the chunk buffer were
still alive then (a view of it outliving the chunk loop, as once for the copy that ended the forward),
the peak would grow by that tensor: +297 MiB at V = 151,936, H = 1,024 in bf16. The tests look at every live
tensor at the moment of that write (`gc` sees each tensor and each view; a view keeps its base's storage alive),
and count the scoring path's chunk rows by budget.
"""

from __future__ import annotations

import gc

import pytest
import torch

from grpo_kernels import default_chunk_tokens, fused_linear_grpo_loss, selective_logprobs
from grpo_kernels.functional import CHUNK_BUFFER_BYTES, SCORING_BUFFER_BYTES

# Sizes chosen so that no two buffers have the same byte count: chunk buffer C x V x 2 = 48,000 B,
# weight V x H x 2 = 32,000 B, fp32 accumulator 64,000 B, hidden B x T x H x 2 = 5,120 B
B, T, H, V, CHUNK = 4, 20, 16, 1000, 24


def _live_storages() -> dict[int, int]:
    """{data_ptr: nbytes} of the storage under every live tensor (views included)."""
    out = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta:  # type(): no __class__ lookups on proxies
            try:
                storage = obj.untyped_storage()
                out[storage.data_ptr()] = storage.nbytes()
            except RuntimeError:  # fake tensors an earlier torch.compile left to the collector have no data
                continue
    return out


@pytest.mark.parametrize("mask_kind", ["all", "padded"])
def test_chunk_buffer_freed_before_the_dw_write(monkeypatch, mask_kind):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.1).bfloat16().requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.int64)
    if mask_kind == "padded":
        mask[:, T // 2 :] = 0  # the gathering path: a hidden-row buffer beside the chunk buffer
    seen = []
    mul = torch.mul

    def spy(*args, out=None, **kwargs):
        # The fp32 dW accumulator written to bf16 (scaled by grad_output): what else is alive right now?
        if (
            out is not None
            and out.shape == weight.shape
            and out.dtype == torch.bfloat16
            and args[0].dtype == torch.float32
        ):
            seen.append(_live_storages())
        return mul(*args, out=out, **kwargs)

    before = set(_live_storages())  # what other tests left alive is not the call's
    monkeypatch.setattr(torch, "mul", spy)
    loss, _ = fused_linear_grpo_loss(hidden, weight, ids, mask, torch.randn(B, generator=g), chunk_tokens=CHUNK)
    loss.backward()
    monkeypatch.undo()
    assert len(seen) == 1, "the dW write to bf16 was not seen: the test no longer watches the backward"
    chunk_bytes = CHUNK * V * 2
    alive = sorted(n for ptr, n in seen[0].items() if n >= chunk_bytes and ptr not in before)
    # Only the fp32 accumulator (V x H x 4) may be that large: no chunk buffer, no second weight-sized tensor
    assert alive == [V * H * 4], f"alive at the dW write: {alive} bytes (chunk buffer {chunk_bytes})"


def test_dense_hidden_grad_comes_after_the_chunk_buffer(monkeypatch):
    # Rows skipped: dH is kept in valid-row order and the dense hidden.grad (padding rows included: 4x the valid
    # rows at 75% padding) is allocated and filled only once the chunk buffer is gone, so it adds nothing to
    # the loop's peak
    from grpo_kernels import chunk_loop

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.1).bfloat16().requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.int64)
    mask[:, T // 4 :] = 0  # 75% padding
    seen = []
    scatter = chunk_loop.scatter_rows

    def spy(dense, rows, values):
        if dense.shape == (B * T, H):  # the dense dH being filled: what else is alive right now?
            seen.append(_live_storages())
        return scatter(dense, rows, values)

    before = set(_live_storages())
    monkeypatch.setattr(chunk_loop, "scatter_rows", spy)
    loss, _ = fused_linear_grpo_loss(hidden, weight, ids, mask, torch.randn(B, generator=g), chunk_tokens=CHUNK)
    monkeypatch.undo()
    assert len(seen) == 1, "dH was not scattered once: the test no longer watches the end of the loop"
    chunk_bytes = min(CHUNK, int(mask.sum())) * V * 2
    alive = sorted(n for ptr, n in seen[0].items() if n >= chunk_bytes and ptr not in before)
    assert alive == [V * H * 4], f"alive at the dH scatter: {alive} bytes (chunk buffer {chunk_bytes})"
    loss.backward()
    assert torch.equal(hidden.grad[mask == 0], torch.zeros_like(hidden.grad[mask == 0]))


def test_large_calls_take_the_larger_chunk():
    # From LARGE_CALL_TOKENS valid tokens the loss's buffer grows to LARGE_CALL_BUFFER_BYTES (2,048 rows at
    # Qwen's vocabulary); scoring and lean keep theirs
    from grpo_kernels.functional import LARGE_CALL_BUFFER_BYTES, LARGE_CALL_TOKENS

    vocab = 151936
    assert default_chunk_tokens(vocab, torch.bfloat16, tokens=LARGE_CALL_TOKENS - 1) == 1536
    assert default_chunk_tokens(vocab, torch.bfloat16, tokens=LARGE_CALL_TOKENS) == 2048
    assert 2048 * vocab * 2 <= LARGE_CALL_BUFFER_BYTES
    assert default_chunk_tokens(vocab, torch.bfloat16, lean=True, tokens=10**6) == 768
    assert default_chunk_tokens(vocab, torch.bfloat16, scoring=True, tokens=10**6) == 768


def test_scoring_chunk_is_sized_by_its_own_budget():
    vocab = 151936  # Qwen's vocabulary in bf16: 1,536 rows (445 MiB) for the loss, 768 (223 MiB) for scoring
    loss_rows = default_chunk_tokens(vocab, torch.bfloat16)
    score_rows = default_chunk_tokens(vocab, torch.bfloat16, scoring=True)
    assert (loss_rows, score_rows) == (1536, 768)
    assert score_rows * vocab * 2 <= SCORING_BUFFER_BYTES < loss_rows * vocab * 2 <= CHUNK_BUFFER_BYTES


def test_selective_logprobs_uses_the_scoring_chunk(monkeypatch):
    # The chunk buffer selective_logprobs allocates by default: the scoring budget's rows, not the loss's
    monkeypatch.setattr("grpo_kernels.functional.SCORING_BUFFER_BYTES", 32 * V * 4)
    monkeypatch.setattr("grpo_kernels.functional.MIN_CHUNK", 1)
    monkeypatch.setattr("grpo_kernels.functional.CHUNK_STEP", 8)
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(2, 50, H, generator=g), torch.randn(V, H, generator=g)
    shapes = _empty_shapes(lambda: selective_logprobs(h, w, torch.randint(0, V, (2, 50), generator=g)))
    assert (32, V) in shapes, f"no 32-row chunk buffer among {shapes}"


def _empty_shapes(call) -> list[tuple[int, ...]]:
    """The shapes of every torch.empty that `call()` made."""
    shapes, empty = [], torch.empty

    def spy(*args, **kwargs):
        out = empty(*args, **kwargs)
        shapes.append(tuple(out.shape))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", spy)
        call()
    return shapes
