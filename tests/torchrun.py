"""`torch.distributed.run` for tests on one machine, with every socket on loopback: torchrun's `--standalone`
puts its store on this machine's hostname, which a machine without /etc/hosts cannot resolve."""

from __future__ import annotations

import os
import sys

from e2e_support import free_port


def torchrun(ranks: int) -> list[str]:
    """The command line up to the script: `ranks` processes, their store on 127.0.0.1."""
    port = str(free_port())
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks)] + [
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        port,
    ]


def loopback_env(**extra: str) -> dict[str, str]:
    """The environment for it: gloo listens on the loopback interface, not the hostname's."""
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **extra}
