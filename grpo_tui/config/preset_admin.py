"""Managing user presets from the command line: `presets delete NAME` and `presets rename OLD NEW`.

Built-in presets are read-only; a user preset of a built-in's name is used in its place ("shadows"
it), which `presets save` only does when asked (--shadow), since it hides the built-in silently.
"""

from __future__ import annotations

import argparse
import os
import sys

from grpo_tui.config.schema import PRESET_NAME_RE, PresetError
from grpo_tui.config.store import BUILTIN_DIR, delete_user_preset, load_preset_file, user_presets_dir
from grpo_tui.config.types import clip, shorten


def rename_user_preset(old: str, new: str, shadow: bool = False) -> os.PathLike[str]:
    """Rename user preset `old` to `new` (its `name` too); PresetError (one line) when it cannot be."""
    folder = user_presets_dir()
    source = folder / f"{old}.toml"
    if not PRESET_NAME_RE.match(old) or not source.is_file():
        why = "is built-in (read-only)" if (BUILTIN_DIR / f"{old}.toml").is_file() else "is not a user preset"
        raise PresetError([f"{clip(old)}: {why}; user presets are in {folder}"])
    if not PRESET_NAME_RE.match(new):
        raise PresetError([f"name: got {shorten(new)}; letters, digits, '.', '_' or '-' (at most 64)"])
    target = folder / f"{new}.toml"
    if target.exists():
        raise PresetError([f"{target}: a user preset with this name exists; delete or rename it first"])
    if (BUILTIN_DIR / f"{new}.toml").is_file() and not shadow:
        raise PresetError([builtin_name_message(new)])
    from grpo_tui.config.store import save_user_preset

    preset = load_preset_file(source)
    path = save_user_preset(preset, new, shadow=True)
    source.unlink()
    return path


def builtin_name_message(name: str) -> str:
    return (
        f"name: {name} is a built-in preset; choose another name, or pass --shadow to use yours in its place"
        " (delete yours to get the built-in back)"
    )


def cmd_delete(args: argparse.Namespace) -> int:
    path = user_presets_dir() / f"{args.name}.toml"
    if not args.yes:
        if not path.is_file():
            delete_user_preset(args.name)  # raises the one-line reason
        if not sys.stdin.isatty():
            raise PresetError([f"{args.name}: deleting {path} needs --yes when there is no terminal to ask"])
        answer = input(f"Delete user preset {args.name} ({path})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not deleted")
            return 1
    removed = delete_user_preset(args.name)
    print(f"deleted {removed}")
    return 0


def cmd_rename(args: argparse.Namespace) -> int:
    path = rename_user_preset(args.old, args.new, shadow=args.shadow)
    print(f"renamed {args.old} to {args.new}: {path}")
    return 0


def add_parsers(psub: argparse._SubParsersAction) -> None:  # argparse's subparser type is private
    """`presets delete` and `presets rename` on the `presets` command's subparsers."""
    delete = psub.add_parser("delete", help="delete a user preset (asks first; --yes does not)")
    delete.add_argument("name", help="the user preset's name")
    delete.add_argument("--yes", action="store_true", help="delete without asking")
    delete.set_defaults(handler=cmd_delete)
    rename = psub.add_parser("rename", help="rename a user preset")
    rename.add_argument("old", help="the user preset's name")
    rename.add_argument("new", help="its new name")
    rename.add_argument("--shadow", action="store_true", help="allow a built-in's name (yours is used in its place)")
    rename.set_defaults(handler=cmd_rename)
