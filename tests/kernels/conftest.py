"""Run grpo_kernels' Triton kernels on CPU tensors through Triton's interpreter.

TRITON_INTERPRET must be set before the kernels are decorated; if another test module imported
grpo_kernels first, the kernel module is reloaded so its kernels become interpreted functions. Not on a
CUDA machine: there the interpreter would also take over tests/gpu (slowly), which run the real kernels.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    name = "grpo_kernels.triton_ops"
    if name in sys.modules and not sys.modules[name].INTERPRET:
        importlib.reload(sys.modules[name])
        # These decorate their kernels with triton_ops' helpers: again, after them
        for other in ("grpo_kernels.probs", "grpo_kernels.casts"):
            if other in sys.modules:
                importlib.reload(sys.modules[other])

from seeds import next_seed  # tests/ is on sys.path (its conftest.py)

from grpo_kernels import casts, probs, triton_ops


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    """Pin the kernel backend: the torch twins, or the Triton kernels under the interpreter."""
    if request.param == "triton":
        if not triton_ops.HAS_TRITON:
            pytest.skip("triton is not installed")
        if torch.cuda.is_available():
            pytest.skip("CUDA present: tests/gpu run the compiled Triton kernels instead of the interpreter")
        assert triton_ops.INTERPRET, "the Triton kernels must be interpreted on CPU"
        # Shrink the tiles so the tiny test vocabularies cross block and segment boundaries
        monkeypatch.setattr(triton_ops, "STATS_BLOCK", 16)
        monkeypatch.setattr(triton_ops, "STATS_SEGMENT", 64)
        monkeypatch.setattr(probs, "PROBS_BLOCK", 32)
        monkeypatch.setattr(casts, "CAST_BLOCK", 64)
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", request.param)
    return request.param


@pytest.fixture
def triton_interpreter(monkeypatch):
    """Force the interpreted Triton kernels, tiles shrunk for tiny vocabularies (skipped when it is off)."""
    if not triton_ops.INTERPRET:
        pytest.skip("the Triton interpreter is off (CUDA present: tests/gpu cover the kernels)")
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", "triton")
    monkeypatch.setattr(triton_ops, "STATS_BLOCK", 16)
    monkeypatch.setattr(triton_ops, "STATS_SEGMENT", 32)


def _make_inputs(
    B=4, T=5, H=16, V=37, *, bias=True, offset=0.0, masked_row=True, off_policy=False, temperature=1.0, seed=None
) -> dict:
    """Random fp64 inputs; `seed` defaults to the next one for this test (see seeds.next_seed)."""
    seed = seed if seed is not None else next_seed()
    print(f"make_inputs seed={seed}")  # pytest shows it beside a failure
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64) / H**0.5 * 2
    b = torch.randn(V, generator=g, dtype=torch.float64) + offset if bias else None
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(torch.int64)
    if masked_row and B > 1:
        mask[1] = 0
    mask[0, 0] = 1  # at least one token counts
    # Positive advantages but a small negative last one: both clip sides occur, and the loss stays well away
    # from 0 so its relative error means something
    adv = torch.randn(B, generator=g, dtype=torch.float64).abs() + 0.5
    if B > 3:
        adv[-1] *= -0.1
    ref = None
    old = None
    with torch.no_grad():
        logits = hidden @ weight.T + (b if b is not None else 0)
        lp = torch.log_softmax(logits / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ref = lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    if off_policy:
        # Ratios far enough from 1 that some clip on both sides
        old = lp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return dict(hidden=hidden, weight=weight, bias=b, ids=ids, mask=mask, adv=adv, ref=ref, old=old)


@pytest.fixture
def make_inputs():
    """Factory of fresh random fp64 inputs: make_inputs(B, T, H, V, bias=, offset=, off_policy=, ...)."""
    return _make_inputs
