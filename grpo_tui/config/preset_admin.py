"""Managing user presets from the command line: `presets save`, `presets delete` and `presets rename`.

Built-in presets are read-only; a user preset of a built-in's name is used in its place ("shadows"
it), which `presets save` only does when asked (--shadow), since it hides the built-in silently.
"""

from __future__ import annotations

import argparse
import os
import sys

from grpo_tui.config.cli_args import add_set_option
from grpo_tui.config.schema import PRESET_NAME_RE, PresetError
from grpo_tui.config.store import (
    BUILTIN_DIR,
    builtin_name_message,
    delete_user_preset,
    load_preset_file,
    save_user_preset,
    user_presets_dir,
)
from grpo_tui.userinput import clip, shorten


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
    preset = load_preset_file(source)
    path = save_user_preset(preset, new, shadow=True)
    source.unlink()
    return path


def cmd_list(args: argparse.Namespace) -> int:
    from grpo_tui.config.store import BUILTIN_DIR, list_presets, preset_description, user_presets_dir

    entries = list_presets()
    width = max([len(e.name) for e in entries] + [4])
    print(f"{'NAME':<{width}}  {'ORIGIN':<8}  DESCRIPTION")
    for entry in entries:
        description = preset_description(entry.path)
        origin = entry.origin + (" (shadows the built-in)" if entry.shadows_builtin else "")
        print(f"{entry.name:<{width}}  {origin:<8}  {description}")
    print(f"\nbuilt-in: {BUILTIN_DIR}\nuser:     {user_presets_dir()}")
    return 0


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


def cmd_save(args: argparse.Namespace) -> int:
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.store import load_preset

    preset, _ = load_preset(args.source, args.overrides)
    result = check_preset(preset, environment=False)
    if result.errors:
        raise PresetError(result.errors)
    path = save_user_preset(preset, args.name, overwrite=args.force, shadow=args.shadow)
    print(f"saved {path}")
    return 0


def add_parsers(psub: argparse._SubParsersAction) -> None:  # argparse's subparser type is private
    """`presets save`, `presets delete` and `presets rename` on the `presets` command's subparsers."""
    save = psub.add_parser("save", help="save a preset, with --set changes, as a user preset")
    save.add_argument("name", help="the new preset's name")
    save.add_argument("--from", dest="source", default="tiny-cpu", help="preset to start from (default tiny-cpu)")
    add_set_option(save)
    save.add_argument("--force", action="store_true", help="replace a user preset of that name")
    save.add_argument("--shadow", action="store_true", help="allow a built-in's name (yours is used in its place)")
    save.set_defaults(handler=cmd_save)
    delete = psub.add_parser("delete", help="delete a user preset (asks first; --yes does not)")
    delete.add_argument("name", help="the user preset's name")
    delete.add_argument("--yes", action="store_true", help="delete without asking")
    delete.set_defaults(handler=cmd_delete)
    rename = psub.add_parser("rename", help="rename a user preset")
    rename.add_argument("old", help="the user preset's name")
    rename.add_argument("new", help="its new name")
    rename.add_argument("--shadow", action="store_true", help="allow a built-in's name (yours is used in its place)")
    rename.set_defaults(handler=cmd_rename)
