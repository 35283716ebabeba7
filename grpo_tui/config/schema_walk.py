"""Walking the preset schema's models: their fields in order, the model at an error's location, a Literal's
choices. Generic over pydantic models; `schema` applies it to `Preset`."""

from __future__ import annotations

import typing
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo


class SchemaField(NamedTuple):
    """One field met by `walk_fields`: its dotted path, pydantic's FieldInfo and its annotation."""

    path: str
    info: FieldInfo
    annotation: Any

    @property
    def section(self) -> type[BaseModel] | None:
        """The model this field holds, when it is a section (a table of fields) rather than a value."""
        return nested_model(self.annotation) if not _is_list(self.annotation) else None


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside `annotation` (`Section`, `list[Spec]`, `Spec | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = nested_model(arg)
        if found is not None:
            return found
    return None


def field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model held by `model`'s field `name` (for a list of models, the items' model), else None."""
    field = model.model_fields.get(name)
    return nested_model(field.annotation) if field is not None else None


def model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel]:
    """The model whose fields sit at `loc` under `root` (a pydantic error location; list indexes are skipped).

    Stops at the deepest model reached, so a location inside a plain value names its parent.
    """
    model = root
    for part in loc:
        if isinstance(part, int):
            continue
        nested = field_model(model, str(part))
        if nested is None:
            break
        model = nested
    return model


def walk_fields(model: type[BaseModel], prefix: str = "") -> Iterator[SchemaField]:
    """Every field of `model` in declaration order, depth first: a section, then its fields.

    Lists of models (`rewards.functions`) are one value, not walked into: their items have no names.
    """
    for name, info in model.model_fields.items():
        field = SchemaField(prefix + name, info, info.annotation)
        yield field
        if field.section is not None:
            yield from walk_fields(field.section, field.path + ".")


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` annotation (also inside `X | None`), else None."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(
        typing.get_origin(a) is list for a in typing.get_args(annotation)
    )
