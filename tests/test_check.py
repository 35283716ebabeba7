"""`grpo-tui check`: the parity probe on tiny-cpu, its failure path and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_tui.tools import parity_check as check


@pytest.mark.parametrize("baseline", ["naive", "trl"])
def test_probe_passes_on_tiny_cpu(tiny_model_path: Path, baseline: str, capsys: pytest.CaptureFixture) -> None:
    assert check.main(["tiny-cpu", "--baseline", baseline]) == 0
    out = capsys.readouterr().out
    assert f"OK: chunked matches {baseline}" in out
    for label in (
        "loss",
        "grad_norm",
        "max |Δ log-prob|",
        "max |Δ grad lm_head|/max",
        "peak MiB loss",
        "time ms scoring",
    ):
        assert label in out


def test_probe_fails_beyond_tolerance(tiny_model_path: Path, capsys: pytest.CaptureFixture) -> None:
    # fp32 chunked and naive sum in different orders: a 1e-12 bound on the log-probs cannot hold
    assert check.main(["tiny-cpu", "--baseline", "naive", "--rtol", "1e-12"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_unknown_preset_is_one_line(capsys: pytest.CaptureFixture) -> None:
    assert check.main(["no-such-preset"]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "no-such-preset" in err


def test_compare_flags_a_gradient_difference() -> None:
    import torch

    logps = torch.zeros(2, 3)
    grad = torch.ones(4, 5)
    a = check.ImplResult("chunked", 1.0, 2.0, logps, grad, {}, {"scoring": 0.0, "loss": 0.0})
    b = check.ImplResult("naive", 1.0, 2.0, logps, grad * 1.01, {}, {"scoring": 0.0, "loss": 0.0})
    ok, lines = check.compare(a, b, 1e-4)
    assert not ok and any("lm_head" in line and line.endswith("NO") for line in lines)
    assert check.compare(a, a, 1e-4)[0]
