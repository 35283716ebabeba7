"""The `grpo-tui` command line.

Imports stay light at module level (argparse only): torch, transformers and Textual load only in
the subcommands that need them, so `grpo-tui presets list` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from grpo_tui.config.cli_args import add_set_option


class Passthrough(NamedTuple):
    """A subcommand implemented elsewhere: its module and function (given the rest of argv), and its help line."""

    module: str
    function: str
    summary: str


PASSTHROUGH: dict[tuple[str, ...], Passthrough] = {
    ("bench", "memory"): Passthrough(
        "grpo_tui.tools.bench_memory", "main", "whole-step peak memory and time per loss implementation"
    ),
    ("max-batch",): Passthrough(
        "grpo_tui.tools.max_batch", "max_batch_main", "the largest per-device batch that fits a memory cap"
    ),
    ("tune",): Passthrough(
        "grpo_tui.tools.tune", "main", "the fastest batch and memory settings under a memory cap, saved as a preset"
    ),
    ("check",): Passthrough("grpo_tui.tools.parity_check", "main", "parity probe: chunked vs a baseline on one batch"),
    ("screenshots",): Passthrough(
        "grpo_tui.tools.screenshots", "main", "SVG/PNG screenshots of the app from real runs"
    ),
    ("slurm",): Passthrough("grpo_tui.launch.slurm", "main", "a run folder plus an sbatch script for a SLURM job"),
    ("resume",): Passthrough("grpo_tui.launch.resume", "main", "continue a stopped or failed run from its checkpoint"),
    ("export",): Passthrough("grpo_tui.train.export", "main", "a run's model as a standalone folder (LoRA merged)"),
    ("eval",): Passthrough(
        "grpo_tui.train.evaluate", "main", "score the base and the trained model on held-out prompts"
    ),
}
EXIT_USAGE = 2  # bad input (argparse uses 2 as well)
EXIT_ENVIRONMENT = 1  # the machine refused (a folder we may not write, a full disk)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `grpo-tui` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        passthrough = _passthrough(argv)
        if passthrough is not None:
            return passthrough
        args = build_parser().parse_args(argv)
        if args.command is None:
            return _bare()
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`grpo-tui runs | head -1`): not an error, as for other Unix tools. What is
        # still buffered must not fail again when Python flushes stdout on exit.
        _stdout_to_devnull()
        return 0
    except Exception as exc:
        answer = user_error(exc, f"grpo-tui {argv[0]}" if argv else "grpo-tui")
        if answer is None:
            raise  # a bug: the traceback is for us
        code, lines = answer
        for line in lines:
            print(line, file=sys.stderr)
        return code


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (captured in tests): nothing to flush
        pass


def user_error(exc: Exception, where: str) -> tuple[int, list[str]] | None:
    """The exit code and one line per problem for an error the user's input or machine caused, else None.

    Inputs are validated before use, so these are the last net: an OSError (ENAMETOOLONG, EACCES,
    ENOSPC), input nested past the recursion limit, text that is not UTF-8, or a ValueError from input.
    """
    import tomllib

    from pydantic import ValidationError  # imported late: pydantic is slow to load

    from grpo_tui.config.schema import PresetError, format_errors
    from grpo_tui.userinput import clip

    if isinstance(exc, PresetError):
        return EXIT_USAGE, exc.lines
    if isinstance(exc, OSError):
        target = f"{clip(str(exc.filename))}: " if exc.filename is not None else ""
        return EXIT_ENVIRONMENT, [f"{where}: {target}{exc.strerror or clip(str(exc))}"]
    if isinstance(exc, RecursionError):
        return EXIT_USAGE, [f"{where}: input nested too deeply to read"]
    if isinstance(exc, UnicodeError):
        return EXIT_USAGE, [f"{where}: text that is not valid UTF-8 or cannot be encoded: {clip(str(exc))}"]
    if isinstance(exc, ValidationError):
        return EXIT_USAGE, format_errors(exc, where)
    if isinstance(exc, tomllib.TOMLDecodeError):
        return EXIT_USAGE, [f"{where}: TOML syntax error: {clip(str(exc), 160)}"]
    if isinstance(exc, ValueError):
        return EXIT_USAGE, [f"{where}: {clip(str(exc), 160)}"]
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-tui",
        description="Terminal dashboard and runner for GRPO fine-tuning. Without a command: the app "
        "(in a terminal) or the tiny-cpu preset headless.",
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="{run,resume,presets,runs,control,export,eval,check,bench,max-batch,tune,slurm,screenshots}",
    )

    run = sub.add_parser("run", help="start a preset (name from `presets list` or a .toml path)")
    run.add_argument("preset", help="preset name or path to a .toml file")
    add_set_option(run)
    run.add_argument("--headless", action="store_true", help="progress lines instead of the app")
    run.add_argument("--detach", action="store_true", help="start in the background and print the run folder")
    run.add_argument("--runs-dir", type=Path, help="parent folder of run folders (default: logging.runs_dir)")
    run.set_defaults(handler=_cmd_run)

    presets = sub.add_parser("presets", help="list, show or validate presets")
    psub = presets.add_subparsers(
        dest="presets_command", metavar="{list,show,validate,save,delete,rename}", required=True
    )
    from grpo_tui.config import preset_admin  # light: the store and schema it imports are needed anyway

    plist = psub.add_parser("list", help="built-in and user presets")
    plist.set_defaults(handler=preset_admin.cmd_list)
    show = psub.add_parser("show", help="the resolved preset (defaults filled) and its launch command")
    show.add_argument("preset", help="preset name or path to a .toml file")
    add_set_option(show)
    show.add_argument("--explain", action="store_true", help="also each field's value with its description")
    show.set_defaults(handler=_cmd_presets_show)
    validate = psub.add_parser("validate", help="check preset files; exit 2 with one line per problem")
    validate.add_argument("files", nargs="+", help="preset names or .toml files")
    validate.set_defaults(handler=_cmd_presets_validate)
    preset_admin.add_parsers(psub)

    runs = sub.add_parser("runs", help="list runs with their status")
    runs.add_argument("--runs-dir", type=Path, default=Path("runs"), help="folder holding run folders (default: runs)")
    tidy = runs.add_mutually_exclusive_group()
    tidy.add_argument("--delete", type=Path, metavar="RUN", help="delete a run folder (not a live run)")
    tidy.add_argument("--prune", type=Path, metavar="RUN", help="drop a run's checkpoints/, keeping model/")
    runs.add_argument("--yes", action="store_true", help="with --delete/--prune: do not ask")
    runs.set_defaults(handler=_cmd_runs)

    control = sub.add_parser("control", help="switch the loss implementation, stop a run or dump its stacks")
    control.add_argument("run_dir", type=Path, help="the run folder")
    action = control.add_mutually_exclusive_group(required=True)
    from grpo_tui.config.schema import LOSS_IMPLS  # here, not at the top: `grpo-tui` must start fast

    action.add_argument("--loss-impl", choices=LOSS_IMPLS, help="switch at the next step")
    action.add_argument("--stop", action="store_true", help="stop at the next step boundary")
    action.add_argument(
        "--dump-stacks", action="store_true", help="every rank prints its Python stacks into stdout.log (a hang)"
    )
    control.add_argument("--force", action="store_true", help="with --stop: kill the process group now")
    control.set_defaults(handler=_cmd_control)

    sup = sub.add_parser("supervise")  # internal: the detached supervisor (not in the command list)
    sup.add_argument("run_dir", type=Path)
    sup.add_argument("--lock-fd", type=int, default=None)  # the run's claim, handed on by the parent
    sup.set_defaults(handler=_cmd_supervise)

    for words, target in PASSTHROUGH.items():
        if len(words) == 1:
            sub.add_parser(words[0], help=f"{target.summary} (options: grpo-tui {words[0]} --help)", add_help=False)
    sub.add_parser("bench", help="`bench memory ...`", add_help=False)
    return parser


def _passthrough(argv: list[str]) -> int | None:
    """Run a subcommand owned by another module, or None when argv is not one of them."""
    if argv and argv[0] == "bench" and (len(argv) < 2 or ("bench", argv[1]) not in PASSTHROUGH):
        print(
            "grpo-tui bench: expected `bench memory ...` (the kernel benchmark, once `bench kernel`, is "
            "benchmarks/kernel/bench.py in a checkout)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for words, entry in PASSTHROUGH.items():
        if tuple(argv[: len(words)]) == words:
            target = _import_target(entry.module, entry.function, " ".join(words))
            if target is None:
                return 1
            return int(target(argv[len(words) :]) or 0)
    return None


def _import_target(module_name: str, function: str, label: str) -> Callable[[list[str]], Any] | None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            print(f"grpo-tui {label}: not available in this version ({module_name} is missing)", file=sys.stderr)
            return None
        raise
    target = getattr(module, function, None)
    if target is None:
        print(f"grpo-tui {label}: not available in this version ({module_name}.{function} is missing)", file=sys.stderr)
    return target


def _tui_main(run_dir: Path | None = None) -> Callable[[], int] | None:
    """The app's entry (opened on `run_dir` if given), or None when the app cannot be used here."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return None
    try:
        app = importlib.import_module("grpo_tui.dashboard.app")
    except ModuleNotFoundError as exc:
        if exc.name in ("grpo_tui.dashboard.app", "textual"):
            return None
        raise
    entry = getattr(app, "main", None)
    if entry is None:
        return None
    # The app parses its own argv: --open RUN_DIR shows that run's dashboard.
    argv = [] if run_dir is None else ["--open", str(run_dir), "--runs-dir", str(Path(run_dir).parent)]
    return lambda: entry(argv)


def _bare() -> int:
    entry = _tui_main()
    if entry is not None:
        return int(entry() or 0)
    from grpo_tui.config.store import DEFAULT_PRESET

    return _start(DEFAULT_PRESET, [], headless=True, detach=False, runs_dir=None)


def _cmd_run(args: argparse.Namespace) -> int:
    return _start(args.preset, args.overrides, args.headless, args.detach, args.runs_dir)


def _start(preset_arg: str, overrides: list[str], headless: bool, detach: bool, runs_dir: Path | None) -> int:
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset
    from grpo_tui.launch import supervisor

    preset, _ = load_preset(preset_arg, overrides)
    result = check_preset(preset)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if result.errors:
        raise PresetError(result.errors)
    run = supervisor.prepare_run(preset, [], runs_dir, check=False)
    if detach:
        pid = supervisor.spawn_detached(run.path)
        print(f"{run.path} (supervisor pid {pid})")
        return 0
    entry = None if headless else _tui_main(run.path)
    if entry is not None:
        supervisor.spawn_detached(run.path)
        return int(entry() or 0)
    return supervisor.run_foreground(run.path, headless=True)


def _cmd_presets_show(args: argparse.Namespace) -> int:
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.store import dump_preset, load_preset
    from grpo_tui.launch.command import build_launch_command, format_command, launch_env, per_node_commands

    preset, path = load_preset(args.preset, args.overrides)
    run_dir = Path(preset.logging.runs_dir) / f"<timestamp>-{preset.name}"
    print(f"# {path}, resolved (every default filled in)")
    if not preset.data.source.startswith("builtin:"):
        print(f"# data.source: a relative path in the file is read from the file's folder ({path.parent})")
    print(dump_preset(preset))
    if args.explain:
        from grpo_tui.config.reference import explain

        print("# every field, with its description:\n" + "\n".join(f"#   {line}" for line in explain(preset)))
    print("# launch command:")
    print("#   " + format_command(build_launch_command(preset, run_dir), launch_env(preset)))
    if preset.distributed.num_machines > 1:
        for rank, argv in enumerate(per_node_commands(preset, run_dir)):
            print(f"#   machine_rank {rank}: " + format_command(argv, launch_env(preset)))
    result = check_preset(preset, environment=False)
    for line in result.errors:
        print(f"# error: {line}")
    for line in result.notes:
        print(f"# note: {line}")
    return EXIT_USAGE if result.errors else 0


def _cmd_presets_validate(args: argparse.Namespace) -> int:
    from grpo_tui.config.checks import check_preset, environment_errors
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset
    from grpo_tui.userinput import clip

    failed = False
    for arg in args.files:
        try:
            preset, found = load_preset(arg)
        except PresetError as exc:
            failed = True
            for line in exc.lines:
                print(line, file=sys.stderr)
            continue
        path = clip(str(found))
        static = check_preset(preset, environment=False)
        for line in static.errors:
            print(f"{path}: {line}", file=sys.stderr)
        for line in static.notes:
            print(f"{path}: note: {line}", file=sys.stderr)
        for line in environment_errors(preset):
            print(f"{path}: warning (on this machine): {line}", file=sys.stderr)
        failed = failed or bool(static.errors)
        if not static.errors:
            print(f"{path}: ok")
    return EXIT_USAGE if failed else 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from grpo_tui.runs.housekeeping import runs_command

    return runs_command(args.runs_dir, delete=args.delete, prune=args.prune, yes=args.yes)


def _cmd_control(args: argparse.Namespace) -> int:
    from grpo_tui.launch.supervisor import stop_run
    from grpo_tui.runs.folder import RunDir
    from grpo_tui.runs.status import ENDED_STATES, RunStatus, judge

    run = RunDir(args.run_dir.resolve())
    if not run.is_run:
        print(f"{args.run_dir}: not a run folder (no run.json or metrics.jsonl)", file=sys.stderr)
        return EXIT_USAGE
    if args.force and not args.stop:
        print("--force goes with --stop", file=sys.stderr)
        return EXIT_USAGE
    if args.dump_stacks:
        from grpo_tui.launch.stacks import dump_stacks

        asked = dump_stacks(run.path)
        print(asked.message, file=sys.stdout if asked.pids else sys.stderr)
        return 0 if asked.pids else 1
    state = judge(run.path).state
    if state in ENDED_STATES:
        print(f"{args.run_dir}: the run is {state}; nothing reads control requests any more", file=sys.stderr)
        return 1
    if state is RunStatus.LOST:
        # Liveness is judged from local pids: a run on other hosts looks lost here, so the request is still written.
        print(f"note: {run.name} looks lost (no live process of it here); writing the request anyway", file=sys.stderr)
    if args.stop:
        print(stop_run(run.path, force=args.force))
        return 0
    control = run.request(loss_impl=args.loss_impl)
    print(
        f"{run.name}: loss.impl -> {args.loss_impl} requested (request {control['request_id']}); applies at the next step"
    )
    return 0


def _cmd_supervise(args: argparse.Namespace) -> int:
    from grpo_tui.launch.supervisor import supervise
    from grpo_tui.runs.claim import adopt_claim
    from grpo_tui.runs.folder import RunDir

    run = RunDir(args.run_dir.resolve())
    claim = None if args.lock_fd is None else adopt_claim(run, args.lock_fd)
    return supervise(run.path, claim=claim)


if __name__ == "__main__":
    sys.exit(main())
