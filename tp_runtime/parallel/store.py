"""Rendezvous stores that listen on one address, and the local launcher's loopback rendezvous.

torch's c10d TCPStore server binds its port on every interface, whatever host name it is given (and
so do the c10d and static rendezvous of torch's elastic agent). It can instead take over a socket
that is already listening (`master_listen_fd`), which is how a single-machine run stays on
127.0.0.1 and a Ray rank 0 listens only on the address its peers were told:

    store = listening_store("127.0.0.1", 0, timedelta(seconds=60))   # port 0: the OS picks one
    store.port

`LoopbackRendezvous` is the elastic agent's rendezvous for one agent whose workers all run on this
machine (the local launcher): a static rendezvous over such a store, registered as LOOPBACK_BACKEND.
Its workers connect to that store as clients (TORCHELASTIC_USE_AGENT_STORE).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

LOOPBACK_BACKEND = "tp-runtime-loopback"


def listening_store(host: str, port: int, timeout: timedelta, world_size: int | None = None) -> dist.TCPStore:
    """A TCPStore server listening on host:port only (host: an address or a name resolving to one)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
        bound = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    # The store owns the descriptor from here (and closes it): detach it from the Python socket.
    return dist.TCPStore(host, bound, world_size, True, timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())


class LoopbackRendezvous(StaticTCPRendezvous):
    """One agent on this machine; the workers' store is `store` (listening on 127.0.0.1)."""

    def __init__(self, store: dist.TCPStore, run_id: str, timeout: timedelta):
        super().__init__("127.0.0.1", store.port, rank=0, world_size=1, run_id=run_id,
                         timeout=int(timeout.total_seconds()))
        self._store = store  # next_rendezvous then builds on it instead of binding a new one

    def get_backend(self) -> str:
        return LOOPBACK_BACKEND


def _create(params: RendezvousParameters) -> LoopbackRendezvous:
    return LoopbackRendezvous(params.get("store"), params.run_id, timedelta(seconds=params.get_as_int("timeout", 900)))


rendezvous_handler_registry.register(LOOPBACK_BACKEND, _create)
