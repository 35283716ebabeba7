"""`grpo-tui screenshots --recorded` writes the three SVGs (PNG too where chromium is installed)."""

from __future__ import annotations

import pytest

from grpo_tui.tools import screenshots

pytestmark = pytest.mark.slow


def test_recorded_screenshots(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(screenshots, "to_png", lambda svg: None)  # PNG needs chromium: not here
    assert screenshots.main(["--recorded", "--out", str(tmp_path)]) == 0
    for name in screenshots.SHOTS:
        svg = (tmp_path / f"{name}.svg").read_text().replace("&#160;", " ")
        assert svg.startswith("<svg") and "grpo-tui (recorded fixture)" in svg
    assert "RECORDED fixture" in capsys.readouterr().out
    assert "running" in (tmp_path / "dashboard.svg").read_text().replace("&#160;", " ")  # live, mid-run
