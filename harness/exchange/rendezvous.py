"""Rendezvous stores that listen on the one address they are given: loopback for local
runs (issue 18), the master's address across hosts.

torch's TCPStore server (on rank 0, for env:// and tcp:// rendezvous) listens on every
interface whatever host it is given; handed a socket already bound to an address
(master_listen_fd), it listens there alone. `tcp_store` builds such a store;
`hetbench-bound://` is the same as a URL, for torch.distributed.rpc, which takes one (the
parameter servers' rendezvous: on loopback, or on the master's address across hosts).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

# tcp://HOST:PORT whose store server listens on HOST only (an address literal): the RPC
# rendezvous of the parameter servers (torch.distributed.rpc takes a URL, not a store)
BOUND_SCHEME = "hetbench-bound"


def is_address(host: str | None) -> bool:
    """Whether host is an IP address literal (a name is left to torch to resolve)."""
    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True


def agent_store() -> bool:
    """torchrun's agent serves the store: every rank is a client (as torch decides it)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta
              ) -> dist.TCPStore:
    """The TCPStore torch's env:// and tcp:// rendezvous create (rank 0 serves it, every
    rank is a client), except that on an address rank 0's server listens on that address
    only: it is handed a socket already bound there (master_listen_fd)."""
    serve = rank == 0 and not agent_store()
    listen_fd = _bound_socket(host, port) if serve and is_address(host) else None
    return dist.TCPStore(host, port, world_size, serve, timeout, multi_tenant=serve,
                         master_listen_fd=listen_fd,
                         use_libuv=os.environ.get("USE_LIBUV", "1") == "1")


def serve_store(host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """A store served by this process on host:port (that address alone, when it is one),
    waiting for no client: clients come and go as they need it."""
    listen_fd = _bound_socket(host, port) if is_address(host) else None
    return dist.TCPStore(host, port, None, True, timeout, wait_for_workers=False,
                         master_listen_fd=listen_fd,
                         use_libuv=os.environ.get("USE_LIBUV", "1") == "1")


def store_client(host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """A client of the store on host:port; it waits up to `timeout` for the store to
    listen, and each of its operations waits up to `timeout` too."""
    return dist.TCPStore(host, port, None, False, timeout,
                         use_libuv=os.environ.get("USE_LIBUV", "1") == "1")


def _bound_socket(host: str, port: int) -> int:
    """A TCP socket bound to host:port, not yet listening (the store listens on it and
    owns it from then on): its file descriptor."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock.detach()


def bound_url(url: str) -> str:
    """A tcp:// rendezvous URL on an address literal, as the BOUND_SCHEME URL whose store
    listens on that address only; any other URL (a host name, env://) as it is."""
    parts = urlparse(url)
    if parts.scheme != "tcp" or not is_address(parts.hostname):
        return url
    return parts._replace(scheme=BOUND_SCHEME).geturl()


def _bound_rendezvous(url: str, timeout: timedelta = default_pg_timeout,
                         **kwargs: object) -> Iterator[tuple[dist.Store, int, int]]:
    """torch's tcp:// rendezvous handler (the same default timeout), on tcp_store."""
    parts = urlparse(url)
    query = dict(parse_qsl(parts.query))
    if parts.hostname is None or parts.port is None or "rank" not in query \
            or "world_size" not in query:
        raise ValueError(f"{BOUND_SCHEME}:// rendezvous needs host, port, rank and "
                         f"world_size: {url}")
    rank, world_size = int(query["rank"]), int(query["world_size"])
    yield tcp_store(parts.hostname, parts.port, rank, world_size, timeout), rank, world_size
    raise RuntimeError(f"no re-rendezvous with the {BOUND_SCHEME}:// method")


try:
    dist.register_rendezvous_handler(BOUND_SCHEME, _bound_rendezvous)
except RuntimeError:  # this module imported a second time (importlib.reload)
    pass


