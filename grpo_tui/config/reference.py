"""The preset schema as a reference: each field's type, default, bounds and description.

One source for `presets show --explain`, the editor's hints (the descriptions themselves) and docs/presets.md
(`python -m grpo_tui.tools.presets_doc`), so none of them can drift from the schema.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from grpo_tui.config.schema import Preset, walk_fields
from grpo_tui.config.schema_walk import literal_choices

# The constraint attributes pydantic and annotated_types keep on a field's metadata, and how each reads.
BOUND_WORDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <="}


class FieldReference(NamedTuple):
    """One preset field as the reference shows it."""

    path: str  # dotted, as in `--set`
    type: str
    default: str
    bounds: str
    description: str
    section: bool  # a table of fields, not a value


def metadata_of(annotation: Any, info_metadata: list[Any]) -> list[Any]:
    """Every constraint object on a field: its own metadata and that of Annotated[...] inside its annotation
    (also inside `X | None`), but not the items' of a list."""
    found = []
    for item in info_metadata:  # a Field(...) inside Annotated[...] carries its constraints as its metadata
        found += item.metadata if isinstance(item, FieldInfo) else [item]
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return found + metadata_of(None, extra) + metadata_of(base, [])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found += metadata_of(arg, [])
    return found


def bounds_text(metadata: list[Any]) -> str:
    """ "> 0, <= 1" from constraint objects (annotated_types' Gt/Le/MaxLen): where a field narrows a bound of its
    type (`Steps` with `ge=1`), the tightest one."""
    tightest: dict[str, Any] = {}
    for item in metadata:
        for attr in BOUND_WORDS:
            value = getattr(item, attr, None)
            if value is None:
                continue
            lower = attr in ("ge", "gt", "min_length")
            old = tightest.get(attr)
            if old is None or (value > old if lower else value < old):
                tightest[attr] = value
    return ", ".join(
        f"{BOUND_WORDS[attr]} {value:,}" if isinstance(value, int) else f"{BOUND_WORDS[attr]} {value:g}"
        for attr, value in tightest.items()
    )


def type_text(annotation: Any) -> str:
    """A reader's name for a field's type: `chunked | naive | trl`, `int`, `list of str`, `int (or none)`."""
    optional = type(None) in typing.get_args(annotation)
    base = annotation
    while True:  # unwrap Annotated[...] and `X | None` down to the type itself
        if typing.get_origin(base) is typing.Annotated:
            base = typing.get_args(base)[0]
        elif typing.get_origin(base) in (typing.Union, types.UnionType):
            base = next(a for a in typing.get_args(base) if a is not type(None))
        else:
            break
    if typing.get_origin(base) is list:
        text = "list of " + type_text(typing.get_args(base)[0])
    elif (choices := literal_choices(base)) is not None:
        text = " | ".join(str(c) for c in choices)
    else:
        text = getattr(base, "__name__", str(base))
    return f"{text} (or none)" if optional else text


def default_text(info: Any) -> str:
    if info.default is not PydanticUndefined:
        value = info.default
    elif info.default_factory is not None:
        value = info.default_factory()
    else:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list):
        return (
            "[" + ", ".join(str(v.name if isinstance(v, BaseModel) and hasattr(v, "name") else v) for v in value) + "]"
        )
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def field_reference() -> list[FieldReference]:
    """Every field of the preset schema in declaration order, sections first then their fields."""
    return [
        FieldReference(
            path=field.path,
            type="section" if field.section is not None else type_text(field.annotation),
            default=default_text(field.info),
            bounds=bounds_text(metadata_of(field.annotation, field.info.metadata)),
            description=field.info.description or "",
            section=field.section is not None,
        )
        for field in walk_fields()
    ]


def explain(preset: Preset) -> list[str]:
    """`path = value  # description` for each value of `preset`, a header line per section."""
    data = preset.model_dump(mode="json")
    lines = []
    for ref in field_reference():
        if ref.section:
            lines.append(f"[{ref.path}]  # {ref.description}")
            continue
        value: Any = data
        for part in ref.path.split("."):
            value = value[part]
        lines.append(f"{ref.path} = {json.dumps(value)}  # {ref.description}")
    return lines
