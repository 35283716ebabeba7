"""grpo.loss_sub_batch and grpo.activation_offload: same step as without, for every loss type and loss.impl."""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tui.config.checks import check_preset
from grpo_tui.config.schema import Preset, PresetError, validate_data
from grpo_tui.runs.folder import RunDir
from grpo_tui.train import assemble, loss_phase
from grpo_tui.train.loss_phase import (
    LossPhaseMixin,
    group_inputs,
    merge_metric,
    slice_bounds,
    slice_inputs,
    slice_share,
)

TINY_PRESET = Path(__file__).resolve().parents[1] / "presets" / "grpo_tui_presets" / "tiny-cpu.toml"
# Two steps on one generation (num_iterations 2), so step 2 is off-policy; tight clipping makes the clip
# metrics non-zero there, beta > 0 gives a KL to log. 8 sequences per device, sliced 3, 3, 2.
BASE = {
    "per_device_batch_size": 8,
    "num_generations": 4,
    "max_steps": 2,
    "num_iterations": 2,
    "learning_rate": 3e-4,
    "beta": 0.1,
    "epsilon_low": 1e-3,
    "epsilon_high": 1e-3,
    "padding_free": False,  # the slices here are grpo.loss_sub_batch's (test_padding_free.py covers length groups)
}
# fp32 on the CPU: slicing only regroups sums (~1e-7 relative); Adam's first step divides each gradient by
# its own magnitude, so a near-zero gradient's rounding reaches the parameters as ~lr * 1e-2.
SLICED_TOL = 1e-5
# Offloading moves the very same bytes out and back: the step is bit-identical, checked to 1e-6.
OFFLOAD_TOL = 1e-6
STEP_KEYS = ("loss", "grad_norm", "entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean")
STEP_KEYS += ("clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max")
LORA = {"enabled": True, "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def train(
    tmp_path: Path, name: str, impl: str = "chunked", peft: dict | None = None, attn: str | None = None, **grpo: Any
) -> Any:
    data = tomllib.loads(TINY_PRESET.read_text())
    data["grpo"].update(BASE, **grpo)
    data["loss"]["impl"] = impl
    if attn is not None:
        data["model"]["attn_implementation"] = attn
    if peft is not None:
        data["peft"] = peft
    run = RunDir(tmp_path / name)
    run.path.mkdir(parents=True)
    trainer = assemble.build_trainer(Preset.model_validate(data), run)
    trainer.train()
    return trainer


def assert_same_steps(a: Any, b: Any, tol: float) -> None:
    steps_a = [r for r in a.state.log_history if "grad_norm" in r]
    steps_b = [r for r in b.state.log_history if "grad_norm" in r]
    assert len(steps_a) == len(steps_b) == 2
    assert steps_b[1]["clip_ratio/region_mean"] > 0  # the clip metrics are really exercised
    for ra, rb in zip(steps_a, steps_b, strict=True):
        assert set(ra) == set(rb)  # one merged entry per metric, none extra
        for key in STEP_KEYS:
            assert rb[key] == pytest.approx(ra[key], rel=tol, abs=tol, nan_ok=True), key
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert (pa - pb).abs().max().item() <= tol, name


@pytest.mark.parametrize(
    ("impl", "loss_type", "level"),
    [
        ("chunked", "grpo", "token"),
        ("chunked", "bnpo", "token"),
        ("chunked", "dr_grpo", "token"),
        ("chunked", "dapo", "token"),
        ("chunked", "dapo", "sequence"),
        ("naive", "bnpo", "token"),
        ("naive", "dr_grpo", "sequence"),
        ("trl", "grpo", "token"),
        ("trl", "dapo", "token"),
        ("trl", "bnpo", "sequence"),
    ],
)
def test_sliced_step_matches_unsliced(
    tiny_model_path: Path, tmp_path: Path, impl: str, loss_type: str, level: str
) -> None:
    config = {"loss_type": loss_type, "importance_sampling_level": level}
    whole = train(tmp_path, "whole", impl, **config)
    slices = []
    spy = lambda inputs, rows, width: slices.append(list(rows)) or real(inputs, rows, width)  # noqa: E731
    with mock.patch.object(loss_phase, "group_inputs", side_effect=spy):
        sliced = train(tmp_path, "sliced", impl, loss_sub_batch=3, **config)
    assert slices == [[0, 1, 2], [3, 4, 5], [6, 7]] * 2
    assert_same_steps(whole, sliced, SLICED_TOL)


real = group_inputs


def test_sliced_with_gradient_accumulation(tiny_model_path: Path, tmp_path: Path) -> None:
    # Two micro-steps per optimizer step: the first runs under the Trainer's no_sync, the second syncs.
    config = {"loss_type": "bnpo", "gradient_accumulation_steps": 2}
    whole = train(tmp_path, "whole", **config)
    sliced = train(tmp_path, "sliced", loss_sub_batch=3, **config)
    assert_same_steps(whole, sliced, SLICED_TOL)


@pytest.fixture
def cpu_offload(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """TRL's real manager on the CPU, as if the CPU were the accelerator; records each pack's offload."""
    from trl.models import get_act_offloading_ctx_manager

    offloaded: list[bool] = []

    def build(model: torch.nn.Module, device: torch.device) -> Any:
        # TRL reads the accelerator once, when built; CPU-only torch has none.
        with mock.patch("torch.accelerator.current_accelerator", return_value=torch.device("cpu")):
            manager = get_act_offloading_ctx_manager(model, use_pin_memory=False, use_streams=False)
        pack = manager.pack_hook

        def counting_pack(tensor: torch.Tensor) -> int:
            tensor_id = pack(tensor)
            offloaded.append(manager.tracker[tensor_id][1])  # True: copied out, restored in backward
            return tensor_id

        manager.pack_hook = counting_pack
        return manager

    monkeypatch.setattr(loss_phase, "offload_context", build)
    return offloaded


@pytest.mark.parametrize(
    ("impl", "lora", "checkpointing"),
    [("chunked", False, True), ("chunked", True, True), ("naive", True, False), ("trl", False, True)],
)
def test_offload_is_exact(
    tiny_model_path: Path, tmp_path: Path, cpu_offload: list[bool], impl: str, lora: bool, checkpointing: bool
) -> None:
    config = {"gradient_checkpointing": checkpointing, "peft": LORA if lora else None}
    plain = train(tmp_path, "plain", impl, **config)
    assert not cpu_offload
    offloaded = train(tmp_path, "offloaded", impl, activation_offload=True, **config)
    assert any(cpu_offload)  # activations really went through TRL's copy out and back
    assert_same_steps(plain, offloaded, OFFLOAD_TOL)


def test_offload_and_slices_together(tiny_model_path: Path, tmp_path: Path, cpu_offload: list[bool]) -> None:
    plain = train(tmp_path, "plain", loss_type="grpo", gradient_checkpointing=True)
    both = train(
        tmp_path, "both", loss_type="grpo", gradient_checkpointing=True, activation_offload=True, loss_sub_batch=3
    )
    assert any(cpu_offload)
    assert_same_steps(plain, both, SLICED_TOL)


# Whether a device is there, not whether torch was built for one: a CUDA build on a CPU machine runs this.
@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without an accelerator")
def test_offload_is_a_no_op_without_accelerator() -> None:
    context = loss_phase.offload_context(torch.nn.Linear(2, 2), torch.device("cpu"))
    assert type(context).__name__ == "nullcontext"


def test_a_cuda_build_without_a_gpu_offloads_nothing() -> None:
    def cuda_build(check_available: bool = False) -> torch.device | None:
        return None if check_available else torch.device("cuda")  # built for CUDA, no device present

    with mock.patch("torch.accelerator.current_accelerator", cuda_build):
        context = loss_phase.offload_context(torch.nn.Linear(2, 2), torch.device("cpu"))
    assert type(context).__name__ == "nullcontext"


# ---- the pieces ------------------------------------------------------------------------------------
def test_slice_bounds() -> None:
    assert slice_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert slice_bounds(8, None) == slice_bounds(8, 8) == slice_bounds(8, 20) == [(0, 8)]


def test_slice_shares_add_up_to_the_whole() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    inputs = {"completion_ids": torch.zeros_like(mask), "completion_mask": mask}
    bounds = slice_bounds(5, 2)
    for loss_type, total in (("grpo", 1.0), ("dr_grpo", 1.0), ("bnpo", 1.0), ("dapo", 3.0)):
        shares = [float(slice_share(loss_type, inputs, range(start, stop))) for start, stop in bounds]
        assert sum(shares) == pytest.approx(total), loss_type
    with pytest.raises(ValueError, match="no known normaliser"):
        slice_share("made_up", inputs, range(2))


def test_slice_inputs_keeps_scalars_and_refuses_what_it_cannot_slice() -> None:
    inputs = {
        "completion_ids": torch.arange(8).view(4, 2),
        "num_items_in_batch": torch.tensor(7.0),
        "old_per_token_logps": None,
    }
    part = slice_inputs(inputs, 1, 3)
    assert part["completion_ids"].tolist() == [[2, 3], [4, 5]]
    assert part["num_items_in_batch"] is inputs["num_items_in_batch"] and part["old_per_token_logps"] is None
    with pytest.raises(ValueError, match="cannot slice input 'odd'"):
        slice_inputs({**inputs, "odd": torch.zeros(3)}, 0, 2)


def test_merge_metric() -> None:
    # Token means weigh by tokens; an empty slice (0 tokens) logged 0 and weighs nothing.
    assert merge_metric("entropy", [2.0, 0.0, 4.0], [1.0, 0.0, 3.0], [1, 1, 1], [1, 1, 1]) == pytest.approx(3.5)
    assert merge_metric("clip_ratio/low_mean", [1.0, 0.0], [9, 9], [1, 3], [1.0, 3.0]) == pytest.approx(0.25)
    assert merge_metric("clip_ratio/low_min", [math.nan, 0.5, 0.2], [], [], []) == 0.2
    assert merge_metric("clip_ratio/high_max", [math.nan, 0.5, 0.2], [], [], []) == 0.5
    assert math.isnan(merge_metric("clip_ratio/high_max", [math.nan], [], [], []))
    with pytest.raises(RuntimeError, match="no rule to merge metric 'policy_loss'"):
        merge_metric("policy_loss", [1.0], [1.0], [1.0], [1.0])


def test_refusals() -> None:
    fine = {
        "loss_sub_batch": 2,
        "top_entropy_quantile": 1.0,
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        "loss_type": "dapo",
    }
    assert LossPhaseMixin.loss_phase_refusal(SimpleNamespace(**fine)) is None
    assert LossPhaseMixin.loss_phase_refusal(SimpleNamespace(**{**fine, "loss_sub_batch": None})) is None
    bad = SimpleNamespace(**{**fine, "top_entropy_quantile": 0.2, "_entropy_bonus_enabled": True})
    assert LossPhaseMixin.loss_phase_refusal(bad) == (
        "grpo.loss_sub_batch: cannot slice the loss exactly with top_entropy_quantile, entropy_coef; unset it"
    )


# ---- the preset fields -----------------------------------------------------------------------------
def test_fields_validate_and_check() -> None:
    grpo = Preset().grpo
    assert grpo.loss_sub_batch is None and grpo.activation_offload is False
    with pytest.raises(PresetError) as info:
        validate_data({"grpo": {"loss_sub_batch": 0, "activation_offload": "sometimes"}}, "p.toml")
    assert info.value.lines == [
        "p.toml: grpo.loss_sub_batch: got 0; Input should be greater than or equal to 1",
        "p.toml: grpo.activation_offload: got 'sometimes'; Input should be a valid boolean, unable to interpret input",
    ]
    preset = validate_data(
        {"grpo": {"per_device_batch_size": 8, "loss_sub_batch": 8, "activation_offload": True}}, "p.toml"
    )
    notes = check_preset(preset, environment=False).notes
    assert "grpo.loss_sub_batch: 8 >= per_device_batch_size 8, which the loss already uses; it has no effect" in notes
    assert not any("activation_offload" in n for n in notes)
    preset.distributed.use_cpu = True
    assert any(n.startswith("grpo.activation_offload: on the CPU") for n in check_preset(preset, False).notes)


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(sub_batch=ANY_VALUE, offload=ANY_VALUE)
def test_any_value_validates_or_gives_one_line_errors(sub_batch: Any, offload: Any) -> None:
    try:
        preset = validate_data({"grpo": {"loss_sub_batch": sub_batch, "activation_offload": offload}}, "p.toml")
    except PresetError as exc:
        assert exc.lines and all("\n" not in line and line.startswith("p.toml: grpo.") for line in exc.lines)
        return
    assert preset.grpo.loss_sub_batch is None or preset.grpo.loss_sub_batch >= 1
    assert isinstance(preset.grpo.activation_offload, bool)
    check_preset(preset, environment=False)  # the checks take any valid preset


@pytest.mark.slow
def test_sliced_under_two_process_ddp(tiny_model_path: Path, tmp_path: Path) -> None:
    # Under DDP the first slices run under no_sync and the last one reduces; the merged metrics use
    # token counts summed over both ranks, as TRL's global means do.
    import subprocess

    import tomli_w
    from e2e_support import free_port

    from grpo_tui.launch.command import build_launch_command, launch_env, write_accelerate_config
    from grpo_tui.runs.metrics import read_records, step_records

    records = []
    for name, extra in (("whole", {}), ("sliced", {"loss_sub_batch": 3})):
        data = tomllib.loads(TINY_PRESET.read_text())
        data["grpo"].update(BASE, loss_type="bnpo", **extra)
        data["distributed"].update(num_processes=2, main_process_port=free_port())
        preset = Preset.model_validate(data)
        run = RunDir(tmp_path / name)
        run.path.mkdir(parents=True)
        run.config.write_text(tomli_w.dumps(data))
        write_accelerate_config(preset, run.accelerate_config)
        env = {**os.environ, **launch_env(preset), "OMP_NUM_THREADS": "1"}
        argv = build_launch_command(preset, run.path)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records.append(step_records(read_records(run.metrics)))
    whole, sliced = records
    assert len(whole) == len(sliced) == 2 and sliced[1]["clip_ratio/region_mean"] > 0
    for a, b in zip(whole, sliced, strict=True):
        for key in STEP_KEYS:
            assert b[key] == pytest.approx(a[key], rel=SLICED_TOL, abs=SLICED_TOL, nan_ok=True), (a["step"], key)
