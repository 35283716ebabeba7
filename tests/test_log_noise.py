"""The Log tab leaves out library deprecation warnings; the run's own lines, and other warnings, stay."""

from __future__ import annotations

from pathlib import Path

from grpo_tui.dashboard.feed import DashboardFeed
from grpo_tui.tools.demo import make_run

# What transformers printed into a tiny-cpu run's stdout.log.
NOISY = """fake trainer starting
/venv/lib/python3.11/site-packages/transformers/training_args.py:1541: FutureWarning: `gradient_checkpointing` is deprecated and will be removed in v6. Use `activation_checkpointing` instead.
  warnings.warn(f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.", FutureWarning)
step 1 reward 0.20
/venv/lib/python3.11/site-packages/transformers/modeling_utils.py:3314: FutureWarning: `is_gradient_checkpointing` is deprecated and will be removed in v6. Use `is_activation_checkpointing` instead.
  warnings.warn(
/work/x.py:3: UserWarning: the reward returned None for 2 completions
  warnings.warn("the reward returned None")
step 2 reward 0.30
"""


def test_the_log_tab_drops_deprecation_noise(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=3).path
    (run / "stdout.log").write_text(NOISY)
    view = DashboardFeed(run, monitor=None).poll()
    assert list(view.log_lines) == [
        "fake trainer starting",
        "step 1 reward 0.20",
        "/work/x.py:3: UserWarning: the reward returned None for 2 completions",
        '  warnings.warn("the reward returned None")',
        "step 2 reward 0.30",
    ]
