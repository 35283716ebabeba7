"""Training entry: `accelerate launch ... -m grpo_tui.train --run-dir RUN`.

Reads RUN/config.toml (the resolved preset) and runs one `TrainingSession` (train/session.py: the start,
step and control records), then leaves the distributed group. Every failure becomes one record on the main
process's RUN/metrics.jsonl: error (one line + exception type), or oom (phase, step, memory) from any rank.
Exit codes: 0 finished or stopped on request, 1 error, 2 bad configuration, 3 out of memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import MetricsWriter
from grpo_tui.train.heartbeat import enable_stack_dumps
from grpo_tui.train.session import TrainingSession

EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_OOM = 0, 1, 2, 3


def main(argv: list[str] | None = None, hard_exit: bool = False) -> int:
    """Train one run folder; `hard_exit` (the command line) leaves a distributed run without interpreter teardown."""
    parser = argparse.ArgumentParser(prog="python -m grpo_tui.train", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true", help="continue from the run's newest checkpoint")
    args = parser.parse_args(argv)
    # Before the start event publishes this pid: SIGUSR1 unhandled would kill the rank it asks for stacks.
    enable_stack_dumps()
    # Private, as the run folder is: the HF Trainer and transformers create checkpoints and the final model
    # with the process umask (0755 folders, 0644 files under the usual 022), and they hold the user's weights.
    previous_umask = os.umask(0o077)
    run = RunDir(args.run_dir.resolve())
    from accelerate import PartialState

    state = PartialState(cpu=_use_cpu_hint(run))
    writer = MetricsWriter(run.metrics) if state.is_main_process else None
    session, code = None, EXIT_ERROR
    try:
        preset = run.load_preset()
        session = TrainingSession(preset, run, writer, state, resume=args.resume)
        session.run()
        code = EXIT_OK
    except Exception as exc:  # every failure becomes one line for the runner
        code = _report_failure(exc, writer, session)
    finally:
        if writer is not None:
            _close_quietly(writer)
            _settle_quietly(run)
        _shutdown_distributed(state, healthy=code == EXIT_OK, hard_exit=hard_exit, code=code)
        os.umask(previous_umask)  # called in-process (tests, tools): leave the caller's umask as it was
    return code


def _close_quietly(writer: MetricsWriter) -> None:
    try:
        writer.close()
    except OSError as exc:  # a full disk fails the final flush too; the failure is reported already
        print(f"grpo-tui: closing {writer.path.name}: {exc}", file=sys.stderr)


def _settle_quietly(run: RunDir) -> None:
    # The trainer ends last when its supervisor is gone: then run.json's outcome is its to record
    # (a no-op while a supervisor holds the run).
    from grpo_tui.runs.status import settle

    try:
        settle(run.path)
    except Exception as exc:  # the run's end is recorded in the stream already; run.json is a summary
        print(f"grpo-tui: cannot record the run's end in {run.status.name}: {exc}", file=sys.stderr)


def _shutdown_distributed(state: Any, healthy: bool, hard_exit: bool = False, code: int = EXIT_OK) -> None:
    if not state.use_distributed:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if healthy:
        # Leave together: a gloo rank whose peer has already torn down its sockets can abort (SIGABRT)
        # in the transport's background thread, turning a finished run into a failed launch.
        dist.barrier()
    if hard_exit:
        # Everything is written (metrics closed, checkpoints saved). Tearing down gloo's process group or
        # the interpreter still aborted now and then on CPU ("terminate called without an active
        # exception", seen in CI after a finished run), so the process leaves without either. The Python
        # exit hooks still run first: report_to loggers (wandb, trackio) finish and upload there.
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    dist.destroy_process_group()


def _use_cpu_hint(run: RunDir) -> bool:
    # Under `ACCELERATE_USE_CPU=true accelerate launch --multi_gpu` a plain state reports no distribution
    # unless cpu=True; read the preset's flag before building anything heavy.
    try:
        return bool(run.load_preset().distributed.use_cpu) or os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
    except Exception:  # the real error is reported by main
        return os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"


def _report_failure(exc: BaseException, writer: MetricsWriter | None, session: TrainingSession | None) -> int:
    import torch

    from grpo_tui.runs.failures import exception_line, oom_message
    from grpo_tui.tasks.data import DataError
    from grpo_tui.tasks.rewards import RewardError
    from grpo_tui.train.trainer import LossImplError

    if isinstance(exc, torch.OutOfMemoryError):
        phases = session.phases if session is not None else None
        phase = (phases.failed_phase or phases.current) if phases is not None else None
        step = session.step if session is not None else None
        memory = session.memory_now() if session is not None else {}
        message = oom_message(phase, step)
        # Any rank may run out; a non-main rank appends its one event itself (the main one may be stuck
        # waiting for it in a collective).
        oom_writer = writer
        if oom_writer is None and session is not None:
            oom_writer = MetricsWriter(session.run_dir.metrics)
        if oom_writer is not None:
            rank = session.state.process_index if session is not None else 0
            oom_writer.event("oom", phase=phase, step=step, memory=memory, message=message, rank=rank)
            if oom_writer is not writer:
                oom_writer.close()
        print(f"grpo-tui: {message}", file=sys.stderr)
        return EXIT_OOM
    traceback.print_exc()
    if writer is not None:
        message = exception_line(exc)
        try:
            writer.event("error", message=message, type=type(exc).__name__)
        except OSError as again:  # e.g. the disk that filled up: stdout.log may still say it
            print(f"grpo-tui: cannot record the error ({type(exc).__name__}: {message}): {again}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(exc, (DataError, RewardError, LossImplError)) else EXIT_ERROR
