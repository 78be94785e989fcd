"""Listening sockets an HTTP server binds before it serves (the OpenAI endpoint, the web view).

Bound and listening, a socket already takes connections: the kernel queues them (the backlog)
until a server accepts them. So a launcher can bind an HTTP server's address before it reports
ready, which keeps its promise (the address is this instance's, and a client that connects is
answered), and start the server itself after (aiohttp's import alone is 0.2 s of CPU, a fifth of
a cm384 boot): the queued connections are then served. Bound as asyncio's create_server binds
(what aiohttp's TCPSite asks it): every address the host resolves to, SO_REUSEADDR, an IPv6
socket IPv6 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

BACKLOG = 128  # aiohttp's TCPSite default


async def listen(host: str, port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """One listening socket per address `host` resolves to, on `port` (0: one the system picks,
    the same for every address); OSError (socket.gaierror too) as a bind's, none left open.
    The name is resolved by the event loop's resolver (a thread), as create_server resolves
    it: a host name looked up in DNS must not hold the loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    seen: set[tuple[int, object]] = set()
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # the port the first one was given
                sock.bind((address[0], sockets[0].getsockname()[1], *address[2:]))
            else:
                sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        close(sockets)
        raise
    return sockets


def close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
