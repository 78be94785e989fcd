"""Where and how every process serves its Prometheus metrics (what they are: metrics.py).

A process serves `GET /metrics` (text format 0.0.4, or OpenMetrics when the scraper asks for
it) on the topology's metrics port at the host of the first server it hosts
(topology.metrics_address): in-process mode one port after every server's, `--mode procs` and
compose each process on its own address, port 9464 (compose files carry the prometheus.io
scrape labels). The launcher records every process's URL in the state file (`cmemu status`
shows them); `cmemu up --metrics none` serves none. HTTPS with the gRPC servers' certificate
when they speak TLS (the metrics stay open reads: DESIGN principle 11); a silent connection is
closed after the profile's `http_idle_s`.

The handler reads the state on the event loop that owns it (plain values only, a few ms for
cm384) and formats the text on a worker thread.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.errors import bind_error
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import Topology, metrics_address
from cmemu.emulator.runtime import exposition
from cmemu.emulator.runtime.metrics import Families, SupernodeCollector

if TYPE_CHECKING:
    from cmemu.emulator.runtime.inprocess import InProcessSupernode
    from cmemu.emulator.runtime.supernode import Supernode

log = structlog.get_logger("cmemu.metrics")
PATH = "/metrics"
REQUEST_HEAD_MAX = 16 * 1024  # a scraper's request line and headers


class MetricsServer:
    """`GET /metrics` on the process's event loop (asyncio streams, HTTP/1.1, one request per
    connection); another path 404, another method 405. The state is read on the loop, which
    owns it; the text is written on a worker thread. Async context manager, or start() and
    close()."""

    def __init__(
        self,
        *,
        address: str,
        name: str,
        read: Callable[[], Families],
        ssl_context: ssl.SSLContext | None = None,
        idle_s: float = DEFAULT_PROFILE.limits.http_idle_s,
    ) -> None:
        self.address = address
        self.name = name  # who serves it, for errors
        self._read = read
        self._ssl = ssl_context  # HTTPS with the gRPC servers' certificate when they use TLS
        self.idle_s = idle_s  # a silent connection is closed after this
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return url(self.address, tls=self._ssl is not None)

    async def start(self) -> None:
        at = parse_address(self.address, any_port=True)
        try:
            self._server = await asyncio.start_server(
                self._serve,
                at.host,
                at.port,
                reuse_address=True,
                ssl=self._ssl,
                limit=REQUEST_HEAD_MAX,
            )
        except OSError as exc:
            raise bind_error(self.name, self.address, exc) from exc
        log.debug("metrics serving", url=self.url)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.idle_s):
                head = await reader.readuntil(b"\r\n\r\n")
            status, body, kind = await self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            status, body, kind = "400 Bad Request", b"bad request\n", "text/plain"
        except (TimeoutError, ConnectionError):  # silent past the idle time, or gone: no answer
            writer.close()
            return
        try:
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}"
                "\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        target = rest.split(" ")[0].split("?")[0]
        if target != PATH:
            return "404 Not Found", b"not found: GET /metrics\n", "text/plain"
        if method != "GET":
            return "405 Method Not Allowed", b"GET /metrics only\n", "text/plain"
        accept = next(
            (v for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "accept"), ""
        )
        kind = exposition.content_type(accept)
        families = self._read().raw()  # on the loop, which owns the state: plain values only
        body, skipped = await asyncio.to_thread(
            exposition.render, families, openmetrics=kind == exposition.OPENMETRICS
        )
        for name in skipped:  # a contributor's bad family: not the rest
            log.error("metric family skipped", family=name)
        return "200 OK", body, kind


def url(address: str, *, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://{address}{PATH}"


def first_server(topology: Topology, hosted: Collection[str]) -> tuple[str, str] | None:
    """(id, address) of the first server, in topology order (devices, then services), of those
    hosted: the process's metrics live on its host."""
    for d in topology.devices:
        if d.id in hosted:
            return d.id, d.address
    for x in topology.services:
        if x.id in hosted:
            return x.id, x.address
    return None


async def open_metrics(local: InProcessSupernode) -> MetricsServer | None:
    """The process's /metrics, serving; None when the topology has no metrics port."""
    first = first_server(local.topology, local.hosted)
    address = metrics_address(local.topology, first[1]) if first else None
    if first is None or address is None:
        return None
    collector = SupernodeCollector(local)
    server = MetricsServer(
        address=address,
        name=f"the /metrics of {first[0]}'s process",
        read=collector.families,
        ssl_context=local.security.server().ssl_context(),
        idle_s=local.profile.limits.http_idle_s,
    )
    await server.start()
    return server


def endpoints(
    topology: Topology, processes: Mapping[str, Collection[str]], *, tls: bool = False
) -> dict[str, str]:
    """Each process's /metrics URL, from the servers it hosts (process name: server ids);
    processes that share one (a node's devices, as compose aliases) appear once."""
    out: dict[str, str] = {}
    for name, hosted in processes.items():
        first = first_server(topology, hosted)
        address = metrics_address(topology, first[1]) if first else None
        if address is not None and url(address, tls=tls) not in out.values():
            out[name] = url(address, tls=tls)
    return out


def supernode_endpoints(sn: Supernode) -> dict[str, str]:
    """Every process's /metrics URL of a running supernode, by process: the one process in
    process mode, the supervisor's processes in procs mode, and in compose mode each server
    (a node's servers share their container's address, so they appear once). Several
    supernodes in one process serve one /metrics each."""
    out: dict[str, str] = {}
    if sn.engine is not None:  # docker: each container's 9464, inside the compose network only
        return out
    for topology in sn.supernodes:
        servers = [d.id for d in topology.devices] + [x.id for x in topology.services]
        processes: dict[str, Collection[str]]
        if sn.supervisor is None:
            processes = {topology.supernode: servers}
        elif sn.options.mode.name == "compose":  # the compose file's processes name no servers
            processes = {server: (server,) for server in servers}
        else:
            mine = set(servers)
            processes = {
                name: r.spec.servers
                for name, r in sn.supervisor.running.items()
                if mine.intersection(r.spec.servers)
            }
        out |= endpoints(topology, processes, tls=sn.security.tls is not None)
    return out


def summary(urls: Mapping[str, str]) -> str:
    """One line for `cmemu up` and `cmemu status`: the URL, or the first and how many more."""
    if not urls:
        return "none"
    first = next(iter(urls.values()))
    more = len(urls) - 1
    return first if not more else f"{first} and {more} more (one per process)"


__all__ = [
    "PATH",
    "MetricsServer",
    "endpoints",
    "first_server",
    "open_metrics",
    "summary",
    "supernode_endpoints",
    "url",
]
