"""`grpo-tui resume RUN_DIR`: continue a stopped or failed run from its newest checkpoint.

The same run folder goes on: the trainer starts again with `--resume` (train/session.py loads the model,
optimizer, scheduler, RNG and step from RUN/checkpoints/checkpoint-<step>/), appends a start and a
`resume` event to the same metrics.jsonl, and writes no step twice. Checkpoints are saved every
`logging.save_steps` and at every stop, so a stopped run can always be resumed; a failed one only
from a checkpoint saved before it failed.

The run's claim (runs/claim.py) is taken before the checks and handed to the supervisor: of two
resumes at once, one starts and the other is told who holds the run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grpo_tui.config.schema import PresetError
from grpo_tui.launch.supervisor import run_foreground, spawn_detached
from grpo_tui.runs.claim import RESUMING, RunClaim, claim_run
from grpo_tui.runs.folder import RunDir, read_json, write_private_text
from grpo_tui.runs.status import LIVE_STATES, RunStatus, judge, processes_alive
from grpo_tui.userinput import clip, user_path

# The trainer's flag (train/entry.py) that continues from the newest checkpoint.
RESUME_FLAG = "--resume"


def claim_resume(run_dir: Path | str) -> tuple[RunDir, RunClaim]:
    """Claim the run, check it can be resumed and set it up to start again; PresetError (one line) if not.

    The claim is the caller's to hand to the supervisor (or release).
    """
    shown = clip(str(run_dir))
    run = RunDir(user_path(run_dir).resolve())
    if not run.path.is_dir():
        raise PresetError([f"{shown}: no such run folder"])
    if not run.is_run:
        raise PresetError([f"{shown}: not a run folder (no run.json or metrics.jsonl)"])
    claim = claim_run(run, RESUMING)
    try:
        prepare_resume(run, shown)
    except BaseException:
        claim.release()
        raise
    return run, claim


def start_resume(run_dir: Path | str) -> tuple[RunDir, int]:
    """`claim_resume`, then the supervisor in the background holding the claim; returns (run, its pid)."""
    run, claim = claim_resume(run_dir)
    return run, spawn_detached(run.path, claim)


def prepare_resume(run: RunDir, shown: str) -> None:
    """Check that the claimed `run` can be resumed and set it up to start again; PresetError if not.

    Clears a stop request (the resumed trainer would obey it at once), adds `--resume` to the recorded
    launch command and records the run as starting.
    """
    meta = run.read_status()
    state = judge(run.path, meta=meta).state
    if state in LIVE_STATES or state is RunStatus.SUBMITTED or processes_alive(meta, run.metrics):
        raise PresetError([f"{shown}: the run is {state}; stop it before resuming (grpo-tui control RUN --stop)"])
    if state is RunStatus.FINISHED:
        raise PresetError([f"{shown}: the run finished; nothing to resume"])
    checkpoint = run.latest_checkpoint()
    if checkpoint is None:
        raise PresetError(
            [f"{shown}: no checkpoint to resume from (saved every logging.save_steps and when a run is stopped)"]
        )
    command = read_json(run.command) or {}
    if not isinstance(command.get("argv"), list) or not command["argv"]:
        raise PresetError([f"{shown}: no launch command recorded in {run.command.name}"])
    for argv in [command["argv"], *(command.get("per_node") or [])]:
        if isinstance(argv, list) and RESUME_FLAG not in argv:
            argv.append(RESUME_FLAG)
    write_private_text(run.command, json.dumps(command, indent=1) + "\n")
    run.request(stop=False, kill=False)
    run.update_status(
        status=RunStatus.STARTING,
        # The supervisor records its own start time; the run's first one is kept for "started".
        first_started=meta.get("first_started") or meta.get("started") or meta.get("created"),
        created=time.time(),
        ended=None,
        exit_code=None,
        reason=None,
        resumed_from=str(checkpoint),
    )


def main(argv: list[str]) -> int:
    """`grpo-tui resume RUN_DIR [--detach]`: progress lines here, or a background run with --detach."""
    parser = argparse.ArgumentParser(prog="grpo-tui resume", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the run folder (stopped or failed, with a checkpoint)")
    parser.add_argument("--detach", action="store_true", help="resume in the background and print the run folder")
    args = parser.parse_args(argv)
    if args.detach:
        run, pid = start_resume(args.run_dir)
        print(f"{run.path} (supervisor pid {pid})")
        return 0
    run, claim = claim_resume(args.run_dir)
    with claim:
        return run_foreground(run.path, headless=True, claim=claim)
