"""The schema walker: the one place that looks inside the preset's annotations."""

from __future__ import annotations

import typing
from typing import Literal

import pytest
from pydantic import BaseModel

from grpo_tui.cli import main
from grpo_tui.config.schema import (
    LOSS_IMPLS,
    SECTIONS,
    LossImpl,
    LossSection,
    Preset,
    PresetError,
    RewardSpec,
    model_at,
    validate_data,
    walk_fields,
)
from grpo_tui.config.schema_walk import field_model, literal_choices


def _expected_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    # Written out from pydantic's own field lists, independently of walk_fields' recursion.
    paths = []
    for name, info in model.model_fields.items():
        paths.append(prefix + name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths += _expected_paths(info.annotation, f"{prefix}{name}.")
    return paths


def test_walk_fields_meets_every_field_of_the_preset_in_declaration_order() -> None:
    fields = list(walk_fields(Preset))
    assert [f.path for f in fields] == _expected_paths(Preset)
    by_path = {f.path: f for f in fields}
    assert by_path["loss"].section is LossSection
    assert by_path["loss.impl"].section is None and by_path["loss.impl"].annotation == LossImpl
    assert by_path["grpo.learning_rate"].info.default == 1e-6
    # A list of models is one value (its items have no names), so it is not walked into.
    assert by_path["rewards.functions"].section is None
    assert not any(p.startswith("rewards.functions.") for p in by_path)


def test_sections_are_the_presets_tables_in_declaration_order() -> None:
    assert SECTIONS == ("model", "data", "rewards", "grpo", "loss", "peft", "distributed", "logging", "eval")
    assert SECTIONS == tuple(name for name in Preset.model_fields if name not in ("name", "description"))


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (Literal["a", "b"], ("a", "b")),
        (Literal[1, 2] | None, (1, 2)),
        (LossImpl, LOSS_IMPLS),
        (str, None),
        (int | None, None),
    ],
)
def test_literal_choices(annotation: object, expected: tuple | None) -> None:
    assert literal_choices(annotation) == expected


def test_field_model_and_model_at_unwrap_sections_and_lists() -> None:
    assert field_model(Preset, "loss") is LossSection
    assert field_model(Preset, "name") is None and field_model(Preset, "no_such_field") is None
    assert model_at(("rewards", "functions", 0)) is RewardSpec
    assert model_at(("loss", "impl")) is LossSection  # a plain value: its section
    assert model_at(()) is Preset


def test_unknown_key_message_lists_the_allowed_keys() -> None:
    with pytest.raises(PresetError) as caught:
        validate_data({"loss": {"impll": "naive"}, "rewards": {"functions": [{"name": "x", "wieght": 2}]}}, "p.toml")
    lines = caught.value.lines
    assert f"p.toml: loss.impll: unknown key; allowed keys: {', '.join(sorted(LossSection.model_fields))}" in lines
    assert "p.toml: rewards.functions.0.wieght: unknown key; allowed keys: name, weight" in lines


def test_loss_impls_are_read_from_the_schemas_type() -> None:
    assert LOSS_IMPLS == typing.get_args(LossImpl) == typing.get_args(LossSection.model_fields["impl"].annotation)


def test_cli_offers_exactly_the_schemas_loss_impls(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["control", "--help"])
    assert "--loss-impl {" + ",".join(LOSS_IMPLS) + "}" in capsys.readouterr().out


def test_decode_copy_is_one_of_keep_free_off_in_one_line() -> None:
    from grpo_tui.config.schema import DECODE_COPY_MODES

    assert DECODE_COPY_MODES == ("keep", "free", "off")
    assert validate_data({"grpo": {"decode_copy": "free"}}, "p.toml").grpo.decode_copy == "free"
    with pytest.raises(PresetError) as caught:
        validate_data({"grpo": {"decode_copy": "merge"}}, "p.toml")
    (line,) = caught.value.lines
    assert line.startswith("p.toml: grpo.decode_copy:") and all(m in line for m in DECODE_COPY_MODES)


def test_every_field_is_described() -> None:
    """The editor shows each field's description as its hint, `presets show --explain` and docs/presets.md too."""
    from grpo_tui.config.reference import field_reference

    missing = [ref.path for ref in field_reference() if not ref.description.strip()]
    assert missing == [], f"schema fields without a description (a docstring under the field): {missing}"


def test_presets_show_explain_prints_each_value_with_its_description(capsys) -> None:
    from grpo_tui.cli import main
    from grpo_tui.config.schema import walk_fields

    assert main(["presets", "show", "tiny-cpu", "--explain", "--set", "grpo.max_steps=7"]) == 0
    out = capsys.readouterr().out
    assert "#   grpo.max_steps = 7  # Optimizer steps the run trains for." in out
    for field in walk_fields():
        assert f"#   {field.path} = " in out or f"#   [{field.path}]  # " in out, field.path


def test_docs_presets_md_is_current() -> None:
    from grpo_tui.tools import presets_doc

    assert presets_doc.DOC.read_text(encoding="utf-8") == presets_doc.render(), (
        "docs/presets.md is out of date: run python -m grpo_tui.tools.presets_doc"
    )
    assert "| `grpo.num_generations` | int | `8` | >= 2, <= 65,536 |" in presets_doc.render()
