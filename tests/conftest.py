"""Suite-wide setup that must happen before any test module imports grpo_kernels, and shared fixtures.

Triton decides at decoration time whether a kernel is compiled or interpreted, so TRITON_INTERPRET is set
here, at the root, before collection imports anything: off CUDA the kernel tests run the Triton kernels
under the interpreter (on CPU tensors, only where a test pins that backend; everything else uses the
torch twins). On a CUDA machine the compiled kernels run and tests/gpu checks them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# No test reaches the network: a hub model the pre-launch check finds uncached is decided offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny-model build per test session, in the session's temp dir.

    GRPO_TUI_CACHE_DIR points at it, so subprocesses (the runner, accelerate) reuse the same build
    instead of touching the user's cache.
    """
    from grpo_tui.tasks.tiny import CACHE_ENV, ensure_tiny_model

    root = tmp_path_factory.getbasetemp() / "grpo-tui-cache"
    os.environ[CACHE_ENV] = str(root)
    return ensure_tiny_model()


@pytest.fixture
def triton_kernel(monkeypatch):
    """grpo_kernels' Triton kernels forced on CPU tensors, under the interpreter (TRITON_INTERPRET, set above)."""
    from grpo_kernels import triton_ops

    if torch.cuda.is_available() or not (triton_ops.HAS_TRITON and triton_ops.INTERPRET):
        pytest.skip("needs the Triton interpreter on CPU (tests/gpu run the compiled kernel)")
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", "triton")


@pytest.fixture
def token_kernel(triton_kernel, monkeypatch):
    """`triton_kernel`, with the token choice in one small block per row: the interpreter runs a program in
    milliseconds."""
    from grpo_kernels import token_choice

    monkeypatch.setattr(token_choice, "QUARTER", 32)
    monkeypatch.setattr(token_choice, "SPLITS", 1)
