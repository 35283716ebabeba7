"""The loss implementations: one class each, one registry, one refusal table read by the checks and the trainer."""

from __future__ import annotations

import typing

import pytest

from grpo_tui.config.checks import check_preset
from grpo_tui.config.overrides import apply_overrides
from grpo_tui.config.schema import LOSS_IMPLS, LossImpl
from grpo_tui.config.store import load_preset
from grpo_tui.losses import IMPLEMENTATIONS, LossImplementation, LossSettings, LossSpec, refusals
from grpo_tui.train.options import TrainerOptions


def test_every_registered_implementation_follows_the_protocol() -> None:
    assert tuple(IMPLEMENTATIONS) == LOSS_IMPLS == typing.get_args(LossImpl)  # the schema reads the registry
    for name, impl in IMPLEMENTATIONS.items():
        assert isinstance(impl, LossImplementation) and impl.name == name
        assert impl.summary and impl.needs
        assert all(row.impl == name and row.reason for row in impl.refusals), name
        assert all(field.startswith("loss.") for field in impl.memory_options), name


def test_the_trl_implementation_leaves_scoring_and_the_loss_to_trl() -> None:
    impl = IMPLEMENTATIONS["trl"]
    assert impl.refusals == () and impl.score(None, None, None, None, 1, None, False) is None
    assert impl.loss(None, None, {}) is None


@pytest.mark.parametrize(
    ("sets", "refused"),
    [
        (["peft.enabled=true", 'peft.target_modules=["q_proj", "lm_head"]'], ["peft.target_modules"]),
        (["grpo.generation_backend=vllm"], ["grpo.generation_backend"]),
        ([], []),
    ],
)
def test_presets_validate_applies_the_refusal_table(sets: list[str], refused: list[str]) -> None:
    preset = apply_overrides(load_preset("tiny-cpu")[0], ["loss.impl=chunked", *sets])
    rows = refusals("chunked", LossSettings.from_preset(preset))
    assert [row.setting for row in rows] == refused
    errors = check_preset(preset, environment=False).errors
    assert all(row.line() in errors for row in rows)  # the very lines the trainer raises
    naive = apply_overrides(preset, ["loss.impl=naive"])
    assert refusals("naive", LossSettings.from_preset(naive)) == []
    assert not any(row.line() in check_preset(naive, environment=False).errors for row in rows)


def test_settings_only_grpo_config_has_are_refused_by_the_same_table() -> None:
    for settings, setting in [
        (LossSettings(loss_type="cispo"), "grpo.loss_type"),
        (LossSettings(loss_type="dapo", top_entropy_quantile=0.2), "top_entropy_quantile"),
        (LossSettings(loss_type="dapo", entropy_bonus=True), "entropy_coef"),
        (LossSettings(loss_type="dapo", bias_correction_kl=True, beta=0.04), "use_bias_correction_kl"),
    ]:
        assert [row.setting for row in refusals("chunked", settings)] == [setting]
    assert refusals("chunked", LossSettings(loss_type="dapo", bias_correction_kl=True, beta=0.0)) == []


def test_trainer_options_come_from_the_preset_typed() -> None:
    preset = apply_overrides(
        load_preset("tiny-cpu")[0],
        ["loss.impl=naive", "loss.chunk_tokens=512", "loss.lean=true", "grpo.scoring_sub_batch=4"],
    )
    options = TrainerOptions.from_preset(preset, profile_dir="/tmp/run")
    assert options.loss == LossSpec(impl="naive", chunk_tokens=512, lean=True)
    assert options.scoring_sub_batch == 4 and options.profile_dir == "/tmp/run"
    assert options.generation_backend == preset.grpo.generation_backend
