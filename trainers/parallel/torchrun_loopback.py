"""`torchrun` whose stores listen on 127.0.0.1 only: the local backend's launcher.

`python -m trainers.parallel.torchrun_loopback <torchrun arguments>` is torchrun, except that
every `TCPStore` server it hosts (the c10d rendezvous store, and the store its workers share)
listens on the loopback interface. torch's `TCPStore` server binds every interface (`::`) whatever
host it is given — seen as two `*:<port>` listeners of `torchrun --standalone` and of an explicit
`--rdzv-endpoint 127.0.0.1:P` alike — so this launcher binds the socket itself on 127.0.0.1 and
hands it to the store (`master_listen_fd`, a documented TCPStore argument). Give it a c10d
endpoint on 127.0.0.1 and `--local-addr 127.0.0.1` (what `TrainJobSpec.torchrun_args` does for
one node), so the workers are told to meet there. The workers' own gloo sockets are on the
loopback address their rendezvous names.

torch is imported when the launcher runs, not when this module is imported: plugins name it as a
module to run (`local_launch.LOOPBACK_TORCHRUN`) and never import it.
"""

from __future__ import annotations

import datetime
import socket
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
BACKLOG = 2048


def bound_listener(port: int) -> tuple[int, int]:
    """(port, file descriptor) of a socket listening on 127.0.0.1:`port` (0: a free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock.getsockname()[1], sock.detach()


def patch_tcp_store() -> None:
    """Make every TCPStore server of this process listen on 127.0.0.1 (see the module docstring)."""
    import torch.distributed as dist  # noqa: PLC0415 - the engine, at run time only

    store_cls: Any = dist.TCPStore  # type: ignore[attr-defined]  # re-exported by torch.distributed undeclared
    if getattr(store_cls, "_slipstream_loopback", False):
        return
    original = store_cls.__init__

    def loopback_init(self: Any, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                      timeout: datetime.timedelta = datetime.timedelta(seconds=300), wait_for_workers: bool = True,
                      multi_tenant: bool = False, master_listen_fd: int | None = None, use_libuv: bool = True) -> None:
        if is_master and master_listen_fd is None:
            port, master_listen_fd = bound_listener(int(port))
        original(self, host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant,
                 master_listen_fd, use_libuv)

    store_cls.__init__ = loopback_init  # the class every module's `TCPStore` name refers to
    store_cls._slipstream_loopback = True


def main(argv: list[str] | None = None) -> None:
    patch_tcp_store()
    from torch.distributed.run import main as torchrun_main  # noqa: PLC0415

    torchrun_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
