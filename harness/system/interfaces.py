"""This host's network interfaces, as the libraries that listen are told to bind one.

gloo, TensorPipe (RPC), NCCL and ps-lite each read a variable of their own for the
interface their sockets bind (INTERFACE_VARIABLES). Across hosts, the interface is the
run's `interface`, or else the one holding the address this host reaches the master from.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                       "DMLC_INTERFACE")
SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


def names() -> list[str]:
    """The interfaces of this host (of this network namespace), sorted."""
    return sorted(name for _, name in socket.if_nameindex())


def binding(name: str) -> dict[str, str]:
    """The variables that make every library that listens bind interface `name`."""
    return dict.fromkeys(INTERFACE_VARIABLES, name)


def missing(name: str) -> str | None:
    """Why `name` cannot be bound here (no such interface), or None."""
    here = names()
    return None if name in here else \
        f"{name!r} is not an interface of this host (it has {', '.join(here)})"


def address_towards(host: str, port: int) -> str:
    """This host's IPv4 address on the route to host:port (no packet is sent: a UDP
    socket's connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])


def ipv4_addresses() -> dict[str, str]:
    """Each interface of this host that has an IPv4 address -> that address."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)
            except OSError:  # an interface without an IPv4 address
                continue
            found[name] = socket.inet_ntoa(answer[20:24])
    return found


def endpoint(name: str) -> tuple[str, int]:
    """This host's IPv4 address on interface `name`, and a TCP port that is free on every
    interface now: for a server that binds them all (TensorFlow's) and must say where it
    listens before it starts. (Another process may take the port in between: unlikely, and
    the server's start then fails loudly.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return ipv4_addresses()[name], port


def holding(address: str) -> str | None:
    """The interface whose IPv4 address is `address`, or None."""
    wanted = str(ipaddress.ip_address(address))
    return next((name for name, held in ipv4_addresses().items() if held == wanted), None)
