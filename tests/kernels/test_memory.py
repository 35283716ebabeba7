"""Which buffers are alive together: the peak memory of a call, checked on CPU without a GPU allocator.

The loss path's peak is the fp32 dW accumulator plus the [C, V] chunk buffer. At the end of a call the
accumulator is copied to the weight's dtype (a weight-sized tensor); if the chunk buffer were still alive then
(a view of it outliving `del buf`, as on d774db5), the peak would grow by that copy: +297 MiB at V = 151,936,
H = 1,024 in bf16. The tests look at every live tensor at the moment of that copy (`gc` sees each tensor and
each view; a view keeps its base's storage alive).
"""

from __future__ import annotations

import gc

import pytest
import torch

from grpo_kernels import fused_linear_grpo_loss

# Sizes chosen so that no two buffers have the same byte count: chunk buffer C x V x 2 = 48,000 B,
# weight V x H x 2 = 32,000 B, fp32 accumulator 64,000 B, hidden B x T x H x 2 = 5,120 B
B, T, H, V, CHUNK = 4, 20, 16, 1000, 24


def _live_storages() -> dict[int, int]:
    """{data_ptr: nbytes} of the storage under every live tensor (views included)."""
    out = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta:  # type(): no __class__ lookups on proxies
            storage = obj.untyped_storage()
            out[storage.data_ptr()] = storage.nbytes()
    return out


@pytest.mark.parametrize("mask_kind", ["all", "padded"])
def test_chunk_buffer_freed_before_the_dw_copy(monkeypatch, mask_kind):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.1).bfloat16().requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.int64)
    if mask_kind == "padded":
        mask[:, T // 2 :] = 0  # the gathering path: a hidden-row buffer beside the chunk buffer
    seen = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        # The copy of the fp32 dW accumulator to bf16: what else is alive right now?
        if self.shape == weight.shape and self.dtype == torch.float32 and torch.bfloat16 in (*args, *kwargs.values()):
            seen.append(_live_storages())
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    loss, _ = fused_linear_grpo_loss(hidden, weight, ids, mask, torch.randn(B, generator=g), chunk_tokens=CHUNK)
    monkeypatch.undo()
    loss.backward()
    assert len(seen) == 1, "the dW copy to bf16 was not seen: the test no longer watches the end of the call"
    chunk_bytes = CHUNK * V * 2
    alive = sorted(n for n in seen[0].values() if n >= chunk_bytes)
    # Only the fp32 accumulator (V x H x 4) may be that large: no chunk buffer, no second weight-sized tensor
    assert alive == [V * H * 4], f"alive at the dW copy: {alive} bytes (chunk buffer {chunk_bytes})"
