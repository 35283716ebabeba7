"""A hub model that is not cached is refused before launch when the hub cannot be reached (no network used)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from grpo_tui.cli import main
from grpo_tui.config import hub_check

MODEL = "Qwen/Qwen3-0.6B"
RUN = ["run", "qwen3-0.6b-gsm8k", "--headless", "--set", "distributed.use_cpu=true"]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    hub_check.hub_reachable.cache_clear()
    return cache


def closed_port() -> int:
    """A loopback port nothing listens on: a connection there is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_offline_and_uncached_is_one_line_before_launch(empty_cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(RUN) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"model.name_or_path: {MODEL} is not in the local cache and HF_HUB_OFFLINE is set;"
        f" download it first with `hf download {MODEL}` (or give a local folder)"
    ]
    assert not (empty_cache.parent / "runs").exists()


def test_an_unreachable_hub_is_one_line_before_launch(empty_cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert main(RUN) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"model.name_or_path: {MODEL} is not in the local cache and the hub (127.0.0.1) is unreachable"
        f" within 3 s; download it first with `hf download {MODEL}` (or give a local folder)"
    ]
    assert not (empty_cache.parent / "runs").exists()


def test_a_cached_model_needs_no_hub(empty_cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = empty_cache / f"models--{MODEL.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert main(["presets", "validate", "qwen3-0.6b-gsm8k"]) == 0
    assert "model.name_or_path" not in capsys.readouterr().err
