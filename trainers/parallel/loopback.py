"""Stores that listen on a loopback address only.

torch's `TCPStore` server binds every interface whatever host it is given. A job whose
rendezvous is on a loopback address (every launcher on one machine) should expose nothing beyond
it, so where Slipstream hosts a store itself it binds the socket on that address and hands it to
the store (`master_listen_fd`, a TCPStore argument): the rendezvous store of an elastic job's first
launcher (trainers.launch), and the process group's store of its rank 0 (trainers.parallel.dist).
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

import torch.distributed as dist

BACKLOG = 2048


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def listen_on(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port` (0: a free port); `host` 'localhost' is 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def host_store(host: str, port: int, world_size: int | None, timeout: timedelta) -> dist.TCPStore:
    """A TCPStore server listening on `host`:`port` only."""
    sock = listen_on(host, port)
    return dist.TCPStore(host, sock.getsockname()[1], world_size, True, timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())
