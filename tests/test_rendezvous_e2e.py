"""A real 2-process tiny-cpu run on one machine listens on loopback only.

While the run trains, every process of the run (its process group, the launcher's descendants: torch's
elastic agent starts each rank in a session of its own) is asked for its listening sockets; each must
be bound to 127.0.0.1 or ::1. The launcher holds torch's rendezvous store, the ranks gloo's sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from test_cli_e2e import grpo_tui_argv, the_run
from test_runner import wait_for

from grpo_tui.launch.launcher import loopback_interface
from grpo_tui.launch.process_group import group_members
from grpo_tui.runs.folder import list_runs
from grpo_tui.runs.metrics import read_records, start_event, step_records

pytestmark = pytest.mark.slow

LOOPBACK = {"127.0.0.1", "::1"}


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every inet socket in LISTEN state held by `pids`."""
    found = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:  # ended meanwhile
            continue
        found += [(pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


def test_a_two_process_run_listens_on_loopback_only(tiny_model_path: Path, tmp_path: Path) -> None:
    argv = [*grpo_tui_argv(), "run", "tiny-cpu", "--headless", "--set", "grpo.max_steps=2000"]
    argv += ["--set", "distributed.num_processes=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A GLOO_SOCKET_IFNAME of the caller's would hide what the launcher sets by itself
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.pop(name, None)
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    groups, ranks = [proc.pid], []
    try:
        wait_for(lambda: len(list_runs(tmp_path / "runs")) == 1, "the run folder")
        run = the_run(tmp_path / "runs")
        wait_for(lambda: len(step_records(read_records(run.metrics))) >= 2 or proc.poll() is not None, "two steps")
        assert proc.poll() is None, run.stdout.read_text()[-3000:]
        pgid = run.read_status()["pgid"]
        groups.append(pgid)
        ranks += [r["pid"] for r in start_event(run.metrics)["ranks"]]
        members = set(group_members(pgid)) | {p.pid for p in psutil.Process(pgid).children(recursive=True)}
        assert {pgid, *ranks} <= members, (members, ranks)  # the launcher and both ranks are looked at
        sockets = listening(sorted(members | {proc.pid}))
        assert sockets, "no listening socket found: the check would prove nothing"
        exposed = [s for s in sockets if s[1] not in LOOPBACK]
        assert exposed == [], f"listening beyond loopback (pid, address, port): {exposed}"
        # gloo listens on the interface of the hostname unless told: where the hostname resolves to a
        # loopback address the check above passes without the setting, so it is checked on its own.
        interfaces = {psutil.Process(pid).environ().get("GLOO_SOCKET_IFNAME") for pid in ranks}
        assert interfaces == {loopback_interface()}
        run.request(stop=True)
        assert proc.wait(timeout=120) == 0, run.stdout.read_text()[-3000:]
    finally:  # a failed check leaves nothing running (the ranks have sessions of their own)
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
