"""Own the rendezvous port before anyone else can: bind it, then host the TCPStore on it.

Both launchers (``ringtrain run`` and ``ringtrain.launch``) play torchrun's agent role:
the launching process hosts the job's ``TCPStore`` and the workers join it as clients.
Binding the socket ourselves, instead of letting ``TCPStore`` bind by port number, buys
three things:

* no race between "pick a free port" and "listen on it": the port is picked by binding
  ``:0`` and the same socket is the one the store listens on;
* a busy port is found by the bind itself, so the error can name it before any worker
  starts (instead of a C++ ``EADDRINUSE`` trace from deep inside the agent);
* a single-machine job listens on loopback only. ``TCPStore`` on its own listens on
  every interface, and it has no authentication.

Two documented ``TCPStore`` arguments make this work
(https://pytorch.org/docs/stable/distributed.html#torch.distributed.TCPStore):
``master_listen_fd`` ("listen on this file descriptor, which must be a socket already
bound to port") and ``multi_tenant`` ("all TCPStore instances in the current process
with the same host/port will use the same underlying TCPServer"). torchrun's static
rendezvous creates its store with ``multi_tenant=True``, so it reuses the server made
here instead of binding the port a second time.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import RingtrainError

if TYPE_CHECKING:  # importing torch costs ~1.5 s; callers import it when they need it
    from torch.distributed import TCPStore

LOOPBACK = "127.0.0.1"


TORCHRUN_DEFAULT_PORT = 29500  # torchrun's default for multi-node static rendezvous

def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (``localhost``)."""
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def is_this_machine(addr: str) -> bool:
    """True when ``addr`` (a name or address) is this machine: loopback, or an address one of its
    interfaces holds. Tested by binding a socket to each address it resolves to: the kernel
    allows that only for its own addresses (EADDRNOTAVAIL otherwise). ``socket.gaierror``
    when the name does not resolve.
    """
    host = addr.strip("[]")
    if is_loopback(host):
        return True
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(sockaddr)
            except OSError:
                continue
            return True
    return False


def loopback_interface() -> str | None:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((name for name in ("lo", "lo0") if name in names), None)


def keep_gloo_on_loopback(environ: dict) -> None:
    """On a one-machine job, make Gloo listen on loopback only (unless the user chose an interface).

    Gloo picks the address its hostname resolves to, which on many machines is the LAN
    address: every worker would then accept unauthenticated connections from the
    network for the whole run. ``GLOO_SOCKET_IFNAME`` is Gloo's documented switch
    (https://pytorch.org/docs/stable/distributed.html#common-environment-variables).
    """
    lo = loopback_interface()
    if lo is not None:
        environ.setdefault("GLOO_SOCKET_IFNAME", lo)


def bind_listener(addr: str, port: int) -> socket.socket:
    """A listening socket on ``port`` (0 = any free one), on loopback only if ``addr`` is loopback.

    Raises RingtrainError naming the port when something else already listens on it.
    """
    host = addr.strip("[]")  # "[::1]", as torchrun writes IPv6 addresses
    try:
        if is_loopback(host):
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            # create_server sets SO_REUSEADDR on POSIX: a port left in TIME_WAIT by the
            # previous run is free to reuse, while a port someone listens on is not.
            return socket.create_server(sockaddr[:2], family=family, backlog=2048)
        # Other nodes must reach this one: listen on every interface, as TCPStore would.
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=2048)
        return socket.create_server(("", port), backlog=2048)
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise RingtrainError(
                f"master port {port} on {addr} is already in use (or not allowed) on this machine: {e.strerror}",
                f"pick another port (--master-port / master_port=; every node must use the same one), "
                f"find the holder with `ss -ltnp | grep :{port}`, or on a single node leave the port "
                "unset to get a free one.",
            ) from e
        raise RingtrainError(
            f"cannot listen on {addr}:{port} for the rendezvous: {e}",
            "--master-addr must be an address of the node with --node-rank 0 (this machine).",
        ) from e


def host_store(addr: str, port: int, timeout: float) -> tuple[TCPStore, int]:
    """Host the job's TCPStore on ``addr:port`` (port 0 = pick a free one); return it and the port.

    Keep the returned store referenced for as long as the job runs: dropping it stops the server.
    """
    listener = bind_listener(addr, port)
    chosen = listener.getsockname()[1]  # before serve_store detaches the socket
    return serve_store(listener, addr, timeout), chosen


def serve_store(listener: socket.socket, addr: str, timeout: float) -> TCPStore:
    """Start a TCPStore server on an already listening socket; the store takes the socket over.

    Clients that connect between ``bind_listener`` and this call wait in the socket's
    backlog, so workers may be started before the server is.
    """
    from torch.distributed import TCPStore

    port = listener.getsockname()[1]
    # The store's server takes ownership of the descriptor and closes it when it stops;
    # detach it so Python's socket object never closes it a second time.
    fd = listener.detach()
    try:
        return TCPStore(
            addr,
            port,
            None,  # world_size: the launcher is not a member; the rendezvous counts members itself
            True,  # is_master: this process hosts the server
            timedelta(seconds=timeout),
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=fd,
        )
    except Exception:
        with contextlib.suppress(OSError):  # the failed server may have closed it already
            os.close(fd)
        raise
