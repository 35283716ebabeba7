"""Shared by the end-to-end tests: Ctrl-C a training subprocess once it has logged a few steps; a free port."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from grpo_tui.runs.metrics import read_records, step_records


def interrupt_after_steps(
    proc: subprocess.Popen, metrics: Callable[[], Path | None], steps: int = 3, start_s: float = 120, stop_s: float = 60
) -> tuple[str | None, str | None]:
    """Wait until `metrics()` holds `steps` step records, send SIGINT, and return (stdout, stderr).

    The process never outlives the call: it is killed if anything goes wrong on the way.
    """
    try:
        deadline = time.monotonic() + start_s
        while True:
            path = metrics()
            if path is not None and len(step_records(read_records(path))) >= steps:
                break
            if proc.poll() is not None:
                stderr = proc.communicate()[1]
                raise AssertionError(f"the process ended before {steps} steps: {(stderr or '')[-3000:]}")
            assert time.monotonic() < deadline, f"no {steps} steps logged within {start_s} s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=stop_s)
    finally:
        if proc.poll() is None:
            proc.kill()


def free_port() -> int:
    """A TCP port free right now: not accelerate's default 29500, which another test or job may hold."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
