"""`accelerate launch`, with a one-machine run's sockets on loopback: `python -m grpo_tui.launch.launcher ARGS`.

ARGS are `accelerate launch`'s own; the run starts exactly as `python -m accelerate.commands.launch ARGS`
would start it. On one machine (num_machines 1) two things change first:

- torch's rendezvous store (a TCPStore server in this process, made by torchrun's agent; the ranks
  are its clients) binds every interface whatever host it is given. Its only way to narrow that is
  `master_listen_fd`, an already listening socket. `LoopbackTCPStore` hands it one on 127.0.0.1 (or
  ::1) whenever the store it serves is on a loopback host, which torchrun's default master address
  is. The port is reserved here, bound but not yet listening, and given to accelerate: no other
  process can take it meanwhile, and accelerate's port-in-use check never sends the run to its
  "standalone" rendezvous (a store on this machine's hostname).
- gloo (CPU) and NCCL's bootstrap listen on the interface of this machine's hostname unless told
  otherwise: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name the loopback interface, unless set already.

Runs over several machines pass through untouched: their store must be reachable from the others.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

# TCPStore's parameters in pybind's order: positional arguments are matched to these names.
TCPSTORE_PARAMETERS = (
    "host_name",
    "port",
    "world_size",
    "is_master",
    "timeout",
    "wait_for_workers",
    "multi_tenant",
    "master_listen_fd",
    "use_libuv",
)
# Where torchrun puts the store when accelerate names no main_process_ip: on one machine it never does.
TORCHRUN_MASTER_ADDR = "127.0.0.1"
# Pending connections the store's listening socket queues: each rank connects once at start-up.
LISTEN_BACKLOG = 128
# The variables that pick the interface gloo and NCCL's bootstrap listen on.
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def loopback_address(host: str | None) -> str | None:
    """The address to listen on for a store on `host`, when `host` is loopback; else None."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:  # a hostname: it may name a reachable interface on purpose
        return None
    return str(address) if address.is_loopback else None


def bind_loopback(address: str, port: int) -> socket.socket:
    """A TCP socket bound to `address`:`port` (0: a free port), not listening yet."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if port:
            # As torch's own store does: a fixed port that the last run just left stays usable.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def loopback_store_class(base: type, reserved: dict[tuple[str, int], socket.socket] | None = None) -> type:
    """A subclass of torch's TCPStore `base` whose server on a loopback host listens on loopback only.

    `reserved` maps (address, port) to sockets bound in advance; a server there takes its socket.
    Clients, servers given their own `master_listen_fd` and servers on other hosts are left as they are.
    """
    sockets = reserved if reserved is not None else {}

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(zip(TCPSTORE_PARAMETERS, args))
            address = loopback_address(kwargs.get("host_name"))
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None and address is not None:
                port = int(kwargs.get("port") or 0)
                sock = (sockets.pop((address, port), None) if port else None) or bind_loopback(address, port)
                sock.listen(LISTEN_BACKLOG)
                # The store owns the descriptor from here and closes it: Python must not close it too.
                kwargs.update(port=sock.getsockname()[1], master_listen_fd=sock.detach())
            super().__init__(**kwargs)

    return LoopbackTCPStore


def install_loopback_store(reserved: dict[tuple[str, int], socket.socket] | None = None) -> type:
    """Make every `TCPStore(...)` in torch.distributed a `LoopbackTCPStore`; returns the class."""
    import torch.distributed as dist

    original = dist.TCPStore
    store = loopback_store_class(original, reserved)
    # torchrun's rendezvous modules say `from torch.distributed import TCPStore`: those imported
    # later read the new class from torch.distributed, those imported already are updated here.
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("torch.distributed")
            and getattr(module, "TCPStore", None) is original
        ):
            module.TCPStore = store
    return store


def loopback_interface() -> str:
    """The name of the network interface that holds 127.0.0.1 (`lo` on Linux)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def main(argv: list[str] | None = None) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args(argv)
    # Flags win over the config file, as in accelerate's own merge.
    config = load_config_from_file(args.config_file) if args.config_file else None
    num_machines = args.num_machines or getattr(config, "num_machines", None) or 1
    if num_machines == 1:
        reserved: dict[tuple[str, int], socket.socket] = {}
        port = (
            args.main_process_port if args.main_process_port is not None else getattr(config, "main_process_port", None)
        )
        if port is not None:  # a distributed run: reserve its port, and say which one it is
            try:
                sock = bind_loopback(TORCHRUN_MASTER_ADDR, int(port))
            except OSError as exc:
                sys.exit(
                    f"grpo-tui: distributed.main_process_port: port {port} on {TORCHRUN_MASTER_ADDR} is taken"
                    f" ({exc.strerror}); choose another, or 0 for a free one"
                )
            args.main_process_port = sock.getsockname()[1]
            reserved[(TORCHRUN_MASTER_ADDR, args.main_process_port)] = sock
        install_loopback_store(reserved)
        interface = loopback_interface()
        for name in SOCKET_IFNAME_VARIABLES:
            os.environ.setdefault(name, interface)
    launch_command(args)


if __name__ == "__main__":
    main()
