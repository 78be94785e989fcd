"""Where and how every process serves its Prometheus metrics (what they are: metrics.py).

A process serves `GET /metrics` (text format 0.0.4, or OpenMetrics when the scraper asks for
it) on the topology's metrics port at the host of the first server it hosts
(topology.metrics_address): in-process mode one port after every server's, `--mode procs` and
compose each process on its own address, port 9464 (compose files carry the prometheus.io
scrape labels). The launcher records every process's URL in the state file (`cmemu status`
shows them); `cmemu up --metrics none` serves none. Plain HTTP even when gRPC speaks TLS: the
metrics are reads, which stay open (DESIGN principle 11).

The handler reads the state on the event loop that owns it (plain values only, a few ms for
cm384) and formats the text on a worker thread.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from emulator.model.errors import AddressInUseError
from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.topology import Topology, metrics_address
from emulator.runtime.metrics import Families, SupernodeCollector

if TYPE_CHECKING:
    from emulator.runtime.inprocess import InProcessSupernode
    from emulator.runtime.supernode import Supernode

log = structlog.get_logger("cmemu.metrics")
PATH = "/metrics"


class _Snapshot(Collector):
    """Families already read, plus the process collector's: what a worker thread formats."""

    def __init__(self, families: Families) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families.metrics()
        yield from ProcessCollector(registry=None).collect()


class MetricsServer:
    """`GET /metrics` on the process's event loop (aiohttp); anything else 404 (405 for other
    methods). Async context manager, or start() and close()."""

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
        self.idle_s = idle_s  # a silent connection is closed after this
        self.name = name  # who serves it, for errors
        self._read = read
        self._ssl = ssl_context  # HTTPS with the gRPC servers' certificate when they use TLS
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return url(self.address, tls=self._ssl is not None)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, keepalive_timeout=self.idle_s
        )
        await runner.setup()
        host, _, port = self.address.rpartition(":")
        site = web.TCPSite(
            runner, host.strip("[]") or None, int(port), reuse_port=False, ssl_context=self._ssl
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise AddressInUseError(self.name, self.address) from exc
        self._runner = runner
        log.debug("metrics serving", url=self.url)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _metrics(self, request: web.Request) -> web.Response:
        families = self._read()  # on the loop, which owns the state: plain values only
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(encode, _Snapshot(families))  # the formatting, off it
        return web.Response(body=body, headers={"Content-Type": content_type})


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
    for topology in sn.supernodes:
        servers = [d.id for d in topology.devices] + [x.id for x in topology.services]
        processes: dict[str, Collection[str]]
        if sn.supervisor is None:
            processes = {topology.supernode: servers}
        elif sn.options.mode == "compose":  # the compose file's processes name no servers
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
