"""Finding, loading, listing and saving presets.

Built-in presets live in the repository's `presets/` folder; user presets in the platform config
folder (`platformdirs.user_config_path("grpo-tui") / "presets"`, or `$GRPO_TUI_PRESETS_DIR`).
A user preset with a built-in's name shadows the built-in. Every failure is a `PresetError`
carrying one line per problem, ready to print.
"""

from __future__ import annotations

import difflib
import importlib.resources
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpo_tui.config.overrides import apply_overrides
from grpo_tui.config.schema import PRESET_NAME_RE, Preset, PresetError, name_from_stem, validate_data
from grpo_tui.tasks.data import LOCAL_SUFFIXES
from grpo_tui.userinput import clip, shorten, user_path

USER_DIR_ENV = "GRPO_TUI_PRESETS_DIR"
# Package data (the repository's top-level presets/ folder), so a wheel install has them too.
BUILTIN_DIR = Path(str(importlib.resources.files("grpo_tui_presets")))
DEFAULT_PRESET = "tiny-cpu"

Origin = Literal["built-in", "user"]


@dataclass(frozen=True)
class PresetEntry:
    name: str
    path: Path
    origin: Origin
    shadows_builtin: bool = False


def user_presets_dir() -> Path:
    override = os.environ.get(USER_DIR_ENV)
    if override:
        return user_path(override)
    import platformdirs  # imported here: only needed when no override is set

    return platformdirs.user_config_path("grpo-tui") / "presets"


def list_presets() -> list[PresetEntry]:
    """Built-in and user presets side by side, sorted by name; a shadowed built-in is left out."""
    builtins = {p.stem: p for p in _toml_files(BUILTIN_DIR)}
    users = {p.stem: p for p in _toml_files(user_presets_dir())}
    entries = [PresetEntry(name, path, "built-in") for name, path in builtins.items() if name not in users]
    entries += [PresetEntry(name, path, "user", name in builtins) for name, path in users.items()]
    return sorted(entries, key=lambda e: (e.name, e.origin))


def _toml_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.toml")) if folder.is_dir() else []


def is_path_like(arg: str) -> bool:
    """A preset argument is a file path when it names a .toml file or contains a path separator."""
    return arg.endswith(".toml") or os.sep in arg or "/" in arg


def find_preset(name: str) -> PresetEntry:
    """The preset called `name` (user first, then built-in), else a PresetError that suggests the
    closest name (a typo is the usual cause) and lists the known ones."""
    entries = list_presets()
    for entry in entries:
        if entry.name == name:
            return entry
    names = [e.name for e in entries]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    known = ", ".join(names) or "(none)"
    raise PresetError([f"{clip(name)}: unknown preset; {hint}known presets: {known} (or give a path to a .toml file)"])


def resolve_preset_path(arg: str) -> Path:
    """Path of the preset named or pointed to by `arg` (a name from `presets list` or a .toml path)."""
    if is_path_like(arg):
        path = user_path(arg)
        try:
            found = path.is_file()
        except OSError as exc:  # a name too long for the file system (ENAMETOOLONG), a folder we may not enter
            raise PresetError([f"{clip(arg)}: cannot read: {exc.strerror}"]) from None
        if not found:
            raise PresetError([f"{clip(arg)}: no such preset file"])
        return path.resolve()
    return find_preset(arg).path


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; syntax errors become one line with the line and column.

    A leading UTF-8 byte order mark (Windows editors write one) is skipped.
    """
    source = clip(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise PresetError([f"{source}: no such file"]) from None
    except OSError as exc:
        raise PresetError([f"{source}: cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise PresetError(
            [f"{source}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8"]
        ) from None
    return parse_toml(text, source)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """`tomllib.loads`, with each way hostile text can make it fail turned into one line for `source`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already ends with "(at line L, column C)".
        raise PresetError([f"{source}: TOML syntax error: {clip(str(exc), 160)}"]) from None
    except RecursionError:
        raise PresetError([f"{source}: arrays or tables nested too deeply to read"]) from None
    except ValueError as exc:  # an integer past Python's int-str digit limit (4,300 digits)
        raise PresetError([f"{source}: value out of range: {clip(str(exc), 160)}"]) from None


def load_preset_file(path: Path) -> Preset:
    """Read and validate one preset file. A file without `name` is named after its stem.

    The stem is made a valid name first ("my preset.toml" is called my-preset): the file is valid.
    """
    data = read_toml(path)
    data.setdefault("name", name_from_stem(Path(path).stem))
    return beside_file(validate_data(data, str(path)), Path(path))


def beside_file(preset: Preset, path: Path) -> Preset:
    """`preset` with a relative local `data.source` read from the preset file's folder, not the
    current one: a preset and the data file beside it work from anywhere."""
    source = preset.data.source
    local = Path(source).suffix in LOCAL_SUFFIXES or source.startswith(("./", "../"))
    if source.startswith("builtin:") or not local or user_path(source).is_absolute():
        return preset
    resolved = str(Path(path).resolve().parent / source)
    return preset.model_copy(update={"data": preset.data.model_copy(update={"source": resolved})})


def load_preset(arg: str, overrides: list[str] | None = None) -> tuple[Preset, Path]:
    """Resolve `arg` (name or path), load and validate it, then apply `--set` overrides (if any).

    Returns the preset and its file.
    """
    path = resolve_preset_path(arg)
    preset = load_preset_file(path)
    if overrides:
        preset = apply_overrides(preset, overrides)
    return preset, path


def preset_to_dict(preset: Preset) -> dict[str, Any]:
    """Everything, defaults filled; None values are left out (TOML has no null)."""
    return _drop_none(preset.model_dump(mode="json"))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def dump_preset(preset: Preset) -> str:
    """The fully resolved preset as TOML text."""
    import tomli_w

    return tomli_w.dumps(preset_to_dict(preset))


def save_user_preset(preset: Preset, name: str | None = None, overwrite: bool = False, shadow: bool = False) -> Path:
    """Write `preset` into the user folder as `<name>.toml` (name defaults to preset.name);
    `overwrite` replaces a user preset of that name; a new one with a built-in's name needs `shadow`."""
    name = name or preset.name
    if not PRESET_NAME_RE.match(name):
        raise PresetError([f"name: got {shorten(name)}; letters, digits, '.', '_' or '-' (at most 64)"])
    folder = user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    if path.exists() and not overwrite:
        raise PresetError([f"{path}: a user preset with this name exists"])
    if not path.exists() and not shadow and (BUILTIN_DIR / f"{name}.toml").is_file():
        raise PresetError([builtin_name_message(name)])
    text = dump_preset(preset.model_copy(update={"name": name}))
    # Written whole then renamed: an overwrite never leaves a half-written preset behind.
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def builtin_name_message(name: str) -> str:
    """The refusal for a new user preset named like a built-in (it would hide the built-in silently)."""
    return (
        f"name: {name} is a built-in preset; choose another name, or pass --shadow to use yours in its place"
        " (delete yours to get the built-in back)"
    )


def delete_user_preset(name: str) -> Path:
    """Remove the user preset `name` (a built-in it shadowed shows again); built-ins are read-only."""
    path = user_presets_dir() / f"{name}.toml"
    if not PRESET_NAME_RE.match(name) or not path.is_file():
        builtin = (BUILTIN_DIR / f"{name}.toml").is_file()
        why = "is built-in (read-only)" if builtin else "is not a user preset"
        raise PresetError([f"{name}: {why}; user presets are in {user_presets_dir()}"])
    path.unlink()
    return path


def preset_description(path: Path) -> str:
    """A preset file's `description`, or why it cannot be read (for listings: never raises on content)."""
    try:
        value = read_toml(path).get("description", "")
    except PresetError as exc:
        return f"(unreadable: {exc.lines[0]})"
    return str(value)
