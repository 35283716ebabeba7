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
