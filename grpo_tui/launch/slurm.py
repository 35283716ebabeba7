"""`grpo-tui slurm PRESET`: a run folder plus an sbatch script that starts it on several SLURM nodes.

The run folder is prepared as for a local run (config.toml, accelerate.yaml, command.json) and its
run.json says `submitted`: the ranks run on other hosts, so the runs list follows the job through the
metrics stream (which must be on a filesystem every node sees) instead of local process ids.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from grpo_tui.config.cli_args import add_set_option
from grpo_tui.config.schema import Preset
from grpo_tui.launch.command import build_launch_command, launch_env

# `#SBATCH --OPTION=VALUE`: long option names only (letters, digits, dashes).
_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


def script_safety_errors(**values: object) -> list[str]:
    """One line per value that cannot go into a shell script safely: a newline or any control character.

    Quoting (`shlex.quote`) keeps spaces and quotes inert, but a newline in a `#` comment or an
    `#SBATCH` line would start a new line of the script, so such values are refused outright.
    """
    return [
        f"{name}: got {str(value)[:80]!r}; a path or name in the job script must be one printable line"
        for name, value in values.items()
        if not str(value).isprintable()
    ]


def slurm_script(preset: Preset, run_dir: Path, workdir: Path, sbatch: dict[str, str] | None = None) -> str:
    """An sbatch script that starts the run on `distributed.num_machines` nodes of a SLURM allocation.

    One task per node runs this machine's launch command with `--machine_rank $SLURM_NODEID` and the
    allocation's first node as the main process address (the preset's own address, if set, is not used:
    the nodes are only known once the job starts). The ranks start in `workdir`, as local runs start
    in the folder they were launched from (a `module:function` reward is imported from there).
    """
    d = preset.distributed
    run_dir = Path(run_dir)
    unsafe = script_safety_errors(
        run_folder=run_dir, workdir=workdir, name=preset.name, **{f"--sbatch {k}": v for k, v in (sbatch or {}).items()}
    )
    if unsafe:
        raise ValueError("; ".join(unsafe))
    options = {
        "job-name": f"grpo-tui-{preset.name}",
        "nodes": str(d.num_machines),
        "ntasks-per-node": "1",
        "output": str(run_dir / "slurm-%j.log"),
    }
    if not d.use_cpu:
        options["gpus-per-node"] = str(d.num_processes)
    options.update(sbatch or {})
    argv = build_launch_command(preset, run_dir)
    split = argv.index("-m", 3)  # launcher flags go before the training module
    node_command = (
        "exec " + shlex.join(argv[:split]) + ' --machine_rank "$SLURM_NODEID" --main_process_ip "$MASTER_ADDR"'
        f" --main_process_port {d.main_process_port} " + shlex.join(argv[split:])
    )
    lines = ["#!/bin/bash", f"# grpo-tui: preset {shlex.quote(preset.name)}, run folder {shlex.quote(str(run_dir))}"]
    # sbatch reads quoted values on #SBATCH lines as the shell would
    lines += [f"#SBATCH --{key}={shlex.quote(value)}" for key, value in options.items()]
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(workdir))}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in launch_env(preset).items()]
    lines += [
        # sed reads the whole list: `head -n 1` would leave scontrol to die of SIGPIPE on a long one,
        # failing the job under pipefail
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "export MASTER_ADDR",
        # $SLURM_NODEID is expanded by each node's own shell, not here
        f"NODE_COMMAND={shlex.quote(node_command)}",
        'srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$NODE_COMMAND"',
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-tui slurm", description="Prepare a run folder and an sbatch script for a multi-node SLURM job."
    )
    parser.add_argument("preset", help="preset name or path to a .toml file")
    add_set_option(parser, example="distributed.num_machines=4")
    parser.add_argument("--runs-dir", type=Path, help="parent folder of run folders, on a filesystem every node sees")
    parser.add_argument("--partition", help="#SBATCH --partition")
    parser.add_argument("--time", help="#SBATCH --time, e.g. 04:00:00")
    parser.add_argument("--account", help="#SBATCH --account")
    parser.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="any other #SBATCH option, e.g. --sbatch cpus-per-task=16; repeatable",
    )
    parser.add_argument("--submit", action="store_true", help="run sbatch on the script and record the job id")
    return parser


def sbatch_options(args: argparse.Namespace) -> dict[str, str]:
    """--partition/--time/--account and each --sbatch OPTION=VALUE; PresetError names a malformed one."""
    from grpo_tui.config.schema import PresetError

    options: dict[str, str] = {}
    for item in args.sbatch:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not value or not _OPTION.fullmatch(key) or not value.isprintable():
            raise PresetError([f"--sbatch: got {item!r}; expected OPTION=VALUE, e.g. cpus-per-task=16"])
        options[key] = value
    named = (("partition", args.partition), ("time", args.time), ("account", args.account))
    for key, value in named:
        if value is not None and (not value or not value.isprintable()):
            raise PresetError([f"--{key}: got {value!r}; expected one line of text"])
    options.update({key: value for key, value in named if value})
    return options


def main(argv: list[str] | None = None) -> int:
    from grpo_tui.config.checks import check_preset
    from grpo_tui.config.schema import PresetError
    from grpo_tui.config.store import load_preset
    from grpo_tui.launch import supervisor
    from grpo_tui.runs.folder import write_private_text
    from grpo_tui.runs.status import RunStatus

    args = build_parser().parse_args(argv)
    options = sbatch_options(args)
    preset, _ = load_preset(args.preset, args.overrides)
    # The login node's GPUs say nothing about the compute nodes', and the main address is the job's
    # first node: neither is checked here.
    result = check_preset(preset, environment=False)
    errors = [e for e in result.errors if not e.startswith("distributed.main_process_ip:")]
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    runs_dir = args.runs_dir if args.runs_dir is not None else preset.logging.runs_dir
    errors += script_safety_errors(**{"logging.runs_dir": runs_dir, "working folder": os.getcwd()})
    if errors:
        raise PresetError(errors)
    if args.submit and shutil.which("sbatch") is None:
        print("grpo-tui slurm: --submit needs sbatch on PATH (run this on the cluster's login node)", file=sys.stderr)
        return 1
    run = supervisor.prepare_run(preset, [], args.runs_dir, check=False)
    script = run.path / "job.sbatch"
    write_private_text(script, slurm_script(run.load_preset(), run.path, Path(os.getcwd()), options))
    run.update_status(status=RunStatus.SUBMITTED, launcher="slurm", script=str(script))
    if not args.submit:
        print(f"{run.path}\nsubmit with: sbatch {script}")
        return 0
    done = subprocess.run(["sbatch", str(script)], capture_output=True, text=True)
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    if done.returncode != 0 or job is None:
        reason = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        run.update_status(status=RunStatus.FAILED, reason=f"sbatch: {reason}")
        print(f"grpo-tui slurm: sbatch refused the job: {reason}", file=sys.stderr)
        return 1
    run.update_status(slurm_job=int(job.group(1)))
    print(f"{run.path}\nsubmitted as SLURM job {job.group(1)}")
    return 0
