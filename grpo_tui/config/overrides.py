"""`--set dotted.key=value` overrides: TOML value syntax, applied to a preset, then revalidated.

`grpo.learning_rate=3e-4`, `peft.enabled=true`, `peft.target_modules=["q_proj","v_proj"]`,
`rewards.functions.0.weight=0.5`. A value that is not valid TOML is taken as a bare string
(`model.name_or_path=Qwen/Qwen3-0.6B`).
"""

from __future__ import annotations

import tomllib
from typing import Any

from pydantic import BaseModel

from grpo_tui.config.schema import Preset, PresetError, validate_data
from grpo_tui.config.schema_walk import field_model
from grpo_tui.userinput import clip, shorten

SOURCE = "--set"


def parse_value(text: str) -> Any:
    """A TOML value (number, bool, string, array, inline table), else the text itself.

    Raises PresetError for values TOML reads but Python cannot hold (4,301 digits, arrays 1,000 deep).
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise PresetError([f"{SOURCE}: got {shorten(text)}; arrays or tables nested too deeply"]) from None
    except ValueError as exc:  # an integer past Python's int-str digit limit
        raise PresetError([f"{SOURCE}: got {shorten(text)}; {clip(str(exc), 160)}"]) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split `a.b=value` into (["a", "b"], parsed value)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise PresetError([f"{SOURCE}: got {shorten(item)}; expected dotted.key=value, e.g. grpo.max_steps=5"])
    return key.split("."), parse_value(raw.strip())


def apply_overrides(preset: Preset, items: list[str]) -> Preset:
    """Apply each `dotted.key=value` in order and revalidate the whole preset."""
    if not items:
        return preset
    data = preset.model_dump(mode="python")
    problems: list[str] = []
    for item in items:
        try:
            path, value = parse_override(item)
            _assign(data, path, value)
        except PresetError as exc:
            problems += exc.lines
    if problems:
        raise PresetError(problems)
    return validate_data(data, SOURCE)


def _assign(data: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = data
    model: type[BaseModel] | None = Preset
    for depth, part in enumerate(path):
        dotted = clip(".".join(path[: depth + 1]))
        last = depth == len(path) - 1
        if isinstance(node, list):
            if not (part.isascii() and part.isdigit()) or len(part) > 9 or int(part) >= len(node):
                raise PresetError([f"{SOURCE}: {dotted}: no item {shorten(part)}; indexes 0..{len(node) - 1}"])
            index = int(part)
            if last:
                node[index] = value
                return
            node = node[index]  # model stays: field_model already unwrapped list[Model]
            continue
        if not isinstance(node, dict) or part not in _keys(node, model):
            allowed = ", ".join(sorted(_keys(node, model))) if isinstance(node, dict) else "(none: not a section)"
            parent = clip(".".join(path[:depth])) or "(top level)"
            raise PresetError([f"{SOURCE}: {dotted}: unknown key in {parent}; allowed keys: {allowed}"])
        if last:
            node[part] = value
            return
        if node[part] is None or not isinstance(node[part], (dict, list)):
            raise PresetError([f"{SOURCE}: {dotted}: is a value, not a section; use {dotted}=VALUE"])
        node, model = node[part], field_model(model, part) if model is not None else None


def _keys(node: dict[str, Any], model: type[BaseModel] | None) -> set[str]:
    return set(model.model_fields) if model is not None else set(node)
