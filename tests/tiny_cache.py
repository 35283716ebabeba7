"""Session fixture shared by the training tests: one tiny-model cache per test session.

Import the fixture into a test module (`from tiny_cache import tiny_model_path`). The cache lives in
the session's temp dir and GRPO_TUI_CACHE_DIR points at it, so subprocesses (the runner, accelerate)
reuse the same build instead of touching the user's cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_tui.tasks.tiny import CACHE_ENV, ensure_tiny_model

    root = tmp_path_factory.getbasetemp() / "grpo-tui-cache"
    os.environ[CACHE_ENV] = str(root)
    return ensure_tiny_model()
