"""The launcher's loopback store: a store server on a loopback host listens on
loopback only; clients, other hosts and multi-machine launches are left alone. The real 2-process
run is in test_rendezvous_e2e.py."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch.distributed as dist

from grpo_tui.config.schema import Preset
from grpo_tui.launch.command import build_launch_command, write_accelerate_config
from grpo_tui.launch.launcher import bind_loopback, loopback_address, loopback_interface, loopback_store_class

TIMEOUT = datetime.timedelta(seconds=20)


def listening_on(port: int) -> list[str]:
    """The local addresses this process listens on at `port`."""
    return [
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.1.1", "127.0.1.1"),
        ("localhost", "127.0.0.1"),
        ("::1", "::1"),
        ("10.1.2.3", None),
        ("0.0.0.0", None),
        ("node-0.cluster", None),  # a hostname may name a reachable interface on purpose
        ("", None),
        (None, None),
    ],
)
def test_loopback_address(host: str | None, address: str | None) -> None:
    assert loopback_address(host) == address


@pytest.mark.parametrize("use_libuv", [True, False])
def test_a_server_on_loopback_listens_on_loopback_only(use_libuv: bool) -> None:
    store_class = loopback_store_class(dist.TCPStore)
    # Positional, as torchrun's static rendezvous calls it
    server = store_class("127.0.0.1", 0, 2, True, TIMEOUT, wait_for_workers=False, use_libuv=use_libuv)
    assert isinstance(server, dist.TCPStore) and server.port > 0
    assert listening_on(server.port) == ["127.0.0.1"]
    server.set("key", "value")
    for client_class in (dist.TCPStore, store_class):  # a rank's client, or one made through the class
        client = client_class("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT, use_libuv=use_libuv)
        assert client.get("key") == b"value"
    assert listening_on(server.port) == ["127.0.0.1"]  # the clients opened no listening socket


def test_a_server_on_localhost_is_reached_through_localhost() -> None:
    server = loopback_store_class(dist.TCPStore)("localhost", 0, is_master=True, timeout=TIMEOUT)
    assert listening_on(server.port) == ["127.0.0.1"]
    server.set("key", "value")
    assert dist.TCPStore("localhost", server.port, timeout=TIMEOUT).get("key") == b"value"


def test_a_server_takes_the_socket_reserved_for_its_port() -> None:
    sock = bind_loopback("127.0.0.1", 0)
    port = sock.getsockname()[1]
    reserved = {("127.0.0.1", port): sock}
    server = loopback_store_class(dist.TCPStore, reserved)("127.0.0.1", port, is_master=True, timeout=TIMEOUT)
    assert reserved == {} and server.port == port and listening_on(port) == ["127.0.0.1"]


class RecordingStore:
    """Stands in for TCPStore: records what the subclass passes on."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("127.0.0.1", 29600), {}),  # a client: is_master defaults to False
        (("127.0.0.1", 29600, 2, False), {}),
        (("10.1.2.3", 29600, 2, True), {}),  # a multi-machine store must stay reachable
        (("node-0", 29600), {"is_master": True}),
        (("127.0.0.1", 29600), {"is_master": True, "master_listen_fd": 99}),  # the caller's own socket
    ],
)
def test_clients_and_other_hosts_are_passed_on_unchanged(args: tuple, kwargs: dict[str, Any]) -> None:
    store = loopback_store_class(RecordingStore)(*args, **kwargs)
    names = ("host_name", "port", "world_size", "is_master")
    assert store.kwargs == {**dict(zip(names, args)), **kwargs}


def test_installed_store_reaches_torchrun_s_rendezvous() -> None:
    """In a fresh interpreter: the modules torchrun's agent makes its store through see the new class."""
    code = (
        "import sys, torch.distributed as dist\n"
        "from grpo_tui.launch.launcher import install_loopback_store\n"
        "r = sys.modules['torch.distributed.rendezvous']  # imported with torch.distributed: updated in place\n"
        "store = install_loopback_store()\n"
        "from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as s, c10d_rendezvous_backend as c\n"
        "print(all(m.TCPStore is store for m in (dist, r, s, c)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"


def test_loopback_interface_holds_127_0_0_1() -> None:
    addresses = psutil.net_if_addrs()[loopback_interface()]
    assert any(a.address == "127.0.0.1" for a in addresses)


def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        preset = Preset.model_validate(
            {"distributed": {"use_cpu": True, "num_processes": 2, "main_process_port": port}}
        )
        write_accelerate_config(preset, tmp_path / "accelerate.yaml")
        argv = build_launch_command(preset, tmp_path)
        env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    finally:
        holder.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"grpo-tui: distributed.main_process_port: port {port} on 127.0.0.1 is taken (Address already in use);"
        " choose another, or 0 for a free one"
    )
