"""model.compile_layers: the decoder layers compiled by torch.compile (inductor on the CPU here) train as the eager
ones do, packed and with gradient checkpointing and LoRA; under FSDP the preset is refused (tests/test_presets.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from test_loss_phase import BASE, LORA, SLICED_TOL, TINY_PRESET, assert_same_steps

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.train import assemble
from grpo_tui.train import length_groups as length_groups_module
from grpo_tui.train.layer_compile import decoder_layers


@pytest.fixture(autouse=True)
def _grouped_at_any_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(length_groups_module, "GROUPED_MIN_CAP", 1)  # tiny-cpu's completions are 4 tokens


def build(tmp_path: Path, name: str, compiled: bool, peft: dict | None = None, **grpo: Any) -> Any:
    data = tomllib.loads(TINY_PRESET.read_text())
    data["grpo"].update(BASE, padding_free=True, **grpo)
    data["loss"]["impl"] = "chunked"
    data["model"].update(attn_implementation="sdpa", compile_layers=compiled)  # sdpa: the rows are packed
    if peft is not None:
        data["peft"] = peft
    run = RunDir(tmp_path / name)
    run.path.mkdir(parents=True)
    return assemble.build_trainer(Preset.model_validate(data), run)


@pytest.mark.parametrize(
    ("peft", "grpo"),
    [(None, {"beta": 0.04}), (LORA, {"gradient_checkpointing": True, "loss_sub_batch": 2})],
    ids=["full-with-reference", "lora-checkpointed-sliced"],
)
def test_compiled_layers_train_as_the_eager_ones(
    tmp_path: Path, tiny_model_path: Path, peft: dict | None, grpo: dict
) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    eager = build(tmp_path, "eager", False, peft, **grpo)
    eager.train()
    compiled = build(tmp_path, "compiled", True, peft, **grpo)
    layers = decoder_layers(compiled.model)
    assert len(layers) == compiled.model.config.num_hidden_layers
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert not any(layer._compiled_call_impl is not None for layer in decoder_layers(eager.model))
    if compiled.ref_model is not None:  # beta > 0 without LoRA: the reference model's layers too
        assert all(layer._compiled_call_impl is not None for layer in decoder_layers(compiled.ref_model))
    assert compiled.packs
    compiled.train()
    assert counters["stats"]["unique_graphs"] > 0  # dynamo really compiled something
    assert_same_steps(eager, compiled, SLICED_TOL)
