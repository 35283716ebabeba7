"""The kernels ship as `grpo_kernels`: the name `kernels` belongs to Hugging Face's package."""

import importlib.metadata
from pathlib import Path

import grpo_kernels

REPO = Path(__file__).resolve().parent.parent


def test_grpo_kernels_is_the_repo_kernels_folder():
    assert Path(grpo_kernels.__file__).resolve().parent == REPO / "kernels"
    assert callable(grpo_kernels.fused_linear_grpo_loss) and callable(grpo_kernels.selective_logprobs)


def test_transformers_does_not_see_a_kernels_package_from_us():
    from transformers.utils import is_kernels_available

    # transformers asks for an installed distribution named `kernels`; ours is grpo-tui and maps only
    # grpo_tui and grpo_kernels, so with Hugging Face's package absent the answer stays False.
    providers = importlib.metadata.packages_distributions()
    assert "grpo-tui" not in providers.get("kernels", [])
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert is_kernels_available() is False
    else:  # someone installed Hugging Face's kernels: then it is theirs, not ours, that transformers sees
        assert is_kernels_available() is True


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'grpo-tui = "grpo_tui.cli:main"' in text
    assert '"grpo_kernels" = "kernels"' in text
