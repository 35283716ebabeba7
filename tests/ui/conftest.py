"""Fixtures for the UI tests: recorded runs (grpo_tui.tools.demo), a fixed clock, a fake monitor, an app factory."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ui_support import FIXED_NOW, FakeMonitor, host_only_snapshot

from grpo_tui.dashboard.app import GrpoTuiApp, create_app
from grpo_tui.tools.demo import make_run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests (Textual's pilot) in a fresh event loop; no async plugin needed."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user presets from this machine, UTC times, cwd in a temp folder."""
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(tmp_path / "user-presets"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture
def recorded_run(runs_dir: Path) -> Path:
    """A finished 300-step run that switched chunked -> naive at step 150."""
    return make_run(runs_dir / "20260101-000000-tiny-cpu", steps=300, switch_step=150).path


@pytest.fixture
def second_run(runs_dir: Path) -> Path:
    """The same preset run with naive throughout (for compare)."""
    return make_run(runs_dir / "20260101-010000-tiny-cpu", steps=300, loss_impl="naive", seed=3).path


@pytest.fixture
def app_factory(runs_dir: Path) -> Callable[..., GrpoTuiApp]:
    def factory(**kwargs) -> GrpoTuiApp:
        kwargs.setdefault("runs_dir", runs_dir)
        kwargs.setdefault("monitor", FakeMonitor(host_only_snapshot()))
        kwargs.setdefault("clock", lambda: FIXED_NOW)
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("auto_attach", False)
        return create_app(**kwargs)

    return factory
