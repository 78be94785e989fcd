"""Keeps the web view's `Machine` up to date from the supernode's public interfaces, so the view
works the same whether the servers run in this process, as processes or from compose; but the
devices themselves (health, fault state, telemetry) come from a DeviceSource (sources.py), read
directly when their servers run in this process (a socket and a call per device there only
crowded the loop that serves them all).

Feeds, each one named task (a failing feed says so in `sources` and retries; the others go on):
- health: each device's health as its server sets it, pushed at once (which is how a fault turns
  its die red within a fraction of a second), from a DeviceSource (sources.py): the servers' own
  state when they run in this process, else one grpc.health.v1 Watch stream per device;
- telemetry: every NPU's (Device/GetTelemetry, or its engine's in this process) in batches, one
  sweep every few seconds (at most 50 a second: cm384 sweeps every 7.7 s);
- links: Fabric/WatchLinkStats for the busiest links, and every few seconds the whole list for
  the L2 sub-planes (the period grows with the link count: one full list of cm384 costs the
  fabric about 0.15 s), both only while a page is open (a listener: `listen`), since nothing
  else reads them and the full list was 14-20% of a cm384 server's CPU in bursts; meanwhile
  their `sources` say "idle" and /api/snapshot holds what the last page saw;
- faults: Fabric/ListFaults, plus the fault state of each device that leaves SERVING;
- serving: Router/GetStats when the topology has a router (tolerating its absence);
- events: the MQTT event topics when a broker runs; otherwise the timeline is made of what the
  feeds above see change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.fabric import FabricClient
from cmemu.emulator.client.status import code_name, reply_of
from cmemu.emulator.engines.fabric.types import LinkStat
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.naming import DeviceKind
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime.events import parse_broker_url, subscriber, topic
from cmemu.emulator.runtime.webview.snapshot import (
    SERVING,
    Json,
    LinkSample,
    Machine,
    plane_utilisation,
)
from cmemu.emulator.runtime.webview.sources import DeviceSource, WireDevices
from cmemu.services.rpc import status_line
from cmemu.v1 import fabric_pb2

if TYPE_CHECKING:
    from cmemu.emulator.client.servingstats import ServingStats

log = structlog.get_logger("cmemu.webview")
Listener = Callable[[Json], None]
IDLE = "idle (no page open)"  # a link feed's source while no page listens


@dataclass(frozen=True, kw_only=True)
class Rates:
    """How often each feed asks: bounded so that a cm384 view costs the emulator little."""

    telemetry_sweep_s: float = 3.0  # every NPU once per sweep (at least) ...
    telemetry_calls_per_s: float = 50.0  # ... and no faster than this (cm384: every 7.7 s) ...
    telemetry_batch: int = 16  # ... this many at a time, the batches spread over the sweep
    top_links: int = 10
    links_interval_s: float = 2.0
    planes_min_interval_s: float = 2.0
    links_per_plane_second: float = 3000.0  # full-list period = links / this (at least min)
    faults_interval_s: float = 2.0
    serving_interval_s: float = 3.0
    publish_interval_s: float = 0.5  # diffs to the pages, coalesced ...
    urgent_s: float = 0.02  # ... but a health change goes out this soon (bursts still coalesce)
    retry_s: float = 1.0
    call_timeout_s: float = 5.0


def _mqtt_error(exc: BaseException) -> bool:
    """An MQTT client's error, without importing aiomqtt here: the events feed imports it when
    it starts, after the state file (issue 18: paho and its imports were 2 MB and 30 ms of the
    boot); until then no error of a feed can be one."""
    aiomqtt = sys.modules.get("aiomqtt")
    return aiomqtt is not None and isinstance(exc, aiomqtt.MqttError)


class Collector:
    """Async context manager: the feeds run in a TaskGroup from entry to exit. Each diff goes to
    every listener (the server's SSE streams) on the event loop."""

    def __init__(
        self,
        machine: Machine,
        clients: Clients,
        *,
        rates: Rates | None = None,
        mqtt_login: Mapping[str, str] | None = None,
        source: DeviceSource | None = None,
    ) -> None:
        self.machine = machine
        self.clients = clients
        self.mqtt_login = dict(mqtt_login or {})  # the broker's login, when it wants one
        self.rates = rates or Rates()
        # the devices' health, fault states and telemetry: read directly when their servers
        # run in this process (the launcher says), else over the network
        self.source = source or WireDevices(clients, retry_s=self.rates.retry_s)
        self.topology: Topology = clients.topology
        self._listeners: set[Listener] = set()
        self._tasks: asyncio.TaskGroup | None = None
        self._running: list[asyncio.Task[None]] = []
        self._closing = False
        self._urgent = asyncio.Event()  # a health change: publish now, not at the next tick
        self._watched = asyncio.Event()  # some page listens: the link feeds run (_page_open)
        self._reasons: dict[str, asyncio.Task[None]] = {}  # a fault state asked, by device

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Hear every diff from now on; the returned call stops it."""
        self._listeners.add(listener)
        self._watched.set()

        def stop() -> None:
            self._listeners.discard(listener)
            if not self._listeners:
                self._watched.clear()

        return stop

    @property
    def running(self) -> bool:
        return self._tasks is not None

    async def _page_open(self, feed: str) -> None:
        """Return once a page listens, saying in `sources` that `feed` waits for one."""
        if not self._watched.is_set():
            self.machine.set_source(feed, IDLE)
            await self._watched.wait()

    async def __aenter__(self) -> Collector:
        tasks = self._tasks = asyncio.TaskGroup()
        await tasks.__aenter__()
        feeds: dict[str, Callable[[], Awaitable[None]]] = {
            "health": self._health,
            "telemetry": self._telemetry,
            "links": self._links,
            "planes": self._planes,
            "faults": self._faults,
            "publish": self._publish,
        }
        if _has(self.topology, ServiceKind.ROUTER):
            feeds["serving"] = self._serving
        if self.topology.broker:
            feeds["events"] = self._events
        else:
            self.machine.set_source("events", "none (no broker)")
        for name, feed in feeds.items():
            self._running.append(tasks.create_task(self._feed(name, feed), name=f"webview-{name}"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is None:
            return
        running, self._running = self._running, []
        self._closing = True
        for task in [*running, *self._reasons.values()]:
            task.cancel()
        await tasks.__aexit__(None, None, None)

    # --- the loop around every feed ------------------------------------------------------------

    async def _feed(self, name: str, feed: Callable[[], Awaitable[None]]) -> None:
        """Run a feed until the view closes: a failure is reported in `sources` and retried
        after a pause. The close's cancellation can reach a feed as an error of its call (grpc
        reports a call cancelled under it as CANCELLED), which must not be retried: the view's
        stop would wait for it for ever."""
        while not self._closing:
            try:
                await feed()
            except (EmulatorError, OSError) as exc:
                self.machine.set_source(name, status_line(exc))
                log.debug("webview feed failed", feed=name, error=status_line(exc))
            except Exception as exc:  # a bug in one feed must not blind the view to the rest
                self.machine.set_source(name, status_line(exc))
                if _mqtt_error(exc):  # the broker away: a failure like the others
                    log.debug("webview feed failed", feed=name, error=status_line(exc))
                else:
                    log.exception("webview feed crashed", feed=name)
            if not self._closing:
                await asyncio.sleep(self.rates.retry_s)

    def _ok(self, name: str) -> None:
        self.machine.set_source(name, "ok")

    # --- feeds ---------------------------------------------------------------------------------

    async def _health(self) -> None:
        """Every device's health, as the source tells it."""
        self.machine.set_source("health", self.source.kind)
        await self.source.run([d.id for d in self.topology.devices], self._health_is)

    def _health_is(self, device: str, health: str) -> None:
        before = self.machine.devices[device].get("health")
        if before == health:
            return
        self.machine.update_device(device, health=health)
        self._urgent.set()
        if before != "UNKNOWN" and not self.topology.broker:
            self.machine.event(device, "health", health)
        if health == SERVING:
            self.machine.update_device(device, reason="")
        elif device not in self._reasons and self._tasks is not None and not self._closing:
            task = self._tasks.create_task(self._fault_reason(device), name=f"reason-{device}")
            self._reasons[device] = task

    async def _fault_reason(self, device: str) -> None:
        """Why a device left SERVING, unless it is back by the answer (a task per device at a
        time: the health feed never waits for it)."""
        try:
            state = await self.source.fault_state(device, deadline_s=self.rates.call_timeout_s)
        except EmulatorError:
            return  # it cannot say (crashed, hung): its health says enough
        except Exception:  # a bug here must not end the view's task group
            log.exception("webview fault state failed", device=device)
            return
        finally:
            self._reasons.pop(device, None)
        if self.machine.devices[device].get("health") != SERVING:
            self.machine.update_device(device, reason=state.reason if state.faulted else "")

    async def _telemetry(self) -> None:
        npus = [d.id for d in self.topology.devices if d.kind is DeviceKind.NPU]
        r = self.rates
        batches = [npus[i : i + r.telemetry_batch] for i in range(0, len(npus), r.telemetry_batch)]
        sweep = max(r.telemetry_sweep_s, len(npus) / r.telemetry_calls_per_s)
        pause = sweep / max(1, len(batches))
        while True:
            for batch in batches:
                started = time.monotonic()
                await asyncio.gather(*(self._one_telemetry(d) for d in batch))
                await asyncio.sleep(max(0.0, pause - (time.monotonic() - started)))
            self._ok("telemetry")

    async def _one_telemetry(self, device: str) -> None:
        try:
            t = await self.source.telemetry(device, deadline_s=self.rates.call_timeout_s)
        except EmulatorError:
            return  # its health says why
        self.machine.update_device(
            device,
            hbm_used=t.memory_used_bytes,
            hbm_capacity=t.memory_capacity_bytes,
            utilization=round(t.utilization, 4),
        )

    async def _links(self) -> None:
        """The busiest links, streamed while a page is open (the stream ends at its first table
        after the last page closed)."""
        r = self.rates
        while True:
            await self._page_open("links")
            watch = FabricClient(self.clients).watch_link_stats(r.top_links, r.links_interval_s)
            async with contextlib.aclosing(watch) as tables:
                async for stats in tables:
                    self.machine.set_section(
                        "links", [_link_json(s) for s in stats.links if s.bytes or s.utilization]
                    )
                    self._ok("links")
                    if not self._watched.is_set():
                        break

    async def _planes(self) -> None:
        """Every link's stats, summed per L2 sub-plane, while a page is open."""
        r = self.rates
        directed = 2 * len(self.topology.links)
        period = max(r.planes_min_interval_s, directed / r.links_per_plane_second)
        while True:
            await self._page_open("planes")
            stats = await FabricClient(self.clients).link_stats(
                directed, deadline_s=r.call_timeout_s
            )
            samples = [_sample(s) for s in stats.links]
            self.machine.set_section("planes", plane_utilisation(samples, self.machine.planes))
            self._ok("planes")
            await asyncio.sleep(period)

    async def _faults(self) -> None:
        while True:
            call = self.clients.fabric().ListFaults(
                fabric_pb2.ListFaultsRequest(), timeout=self.rates.call_timeout_s
            )
            listed = await reply_of(None, call)
            fabric = [{"id": f.id, "kind": f.kind, "target": f.target} for f in listed.faults]
            devices = [
                {
                    "id": str(FaultId.device(d)),
                    "kind": "device",
                    "target": d,
                    "detail": e.get("reason") or e["health"],
                }
                for d, e in self.machine.devices.items()
                if e.get("health") not in (SERVING, "UNKNOWN")
            ]
            self.machine.set_section("faults", fabric + devices)
            self._ok("faults")
            await asyncio.sleep(self.rates.faults_interval_s)

    async def _serving(self) -> None:
        # the router's client (its deployments' records): imported when the feeds start, after
        # the state file, not with the web view, which binds before it
        from cmemu.emulator.client.router import RouterClient

        while True:
            try:
                stats = await RouterClient(
                    self.clients, timeout_s=self.rates.call_timeout_s
                ).stats()
            except EmulatorError as exc:
                if code_name(exc) not in ("UNIMPLEMENTED", "NOT_FOUND"):
                    raise
                self.machine.set_section("serving", None)
                self.machine.set_source("serving", "none")
            else:
                self.machine.set_section("serving", _serving_json(stats))
                self._ok("serving")
            await asyncio.sleep(self.rates.serving_interval_s)

    async def _events(self) -> None:
        assert self.topology.broker is not None
        host, port = parse_broker_url(self.topology.broker)
        async with subscriber(host, port, timeout=5, **self.mqtt_login) as client:
            await client.subscribe(topic(self.topology.supernode, "+", "events"), qos=1)
            self._ok("events")
            async for message in client.messages:
                raw = message.payload
                if not isinstance(raw, bytes | bytearray):
                    continue
                with contextlib.suppress(ValueError, AttributeError):
                    payload: dict[str, Any] = json.loads(raw)
                    skip = {"device", "event", "wall", "emulated_ns"}
                    detail = " ".join(f"{k}={v}" for k, v in payload.items() if k not in skip)
                    self.machine.event(
                        str(payload.get("device", "?")),
                        str(payload.get("event", "?")),
                        detail,
                        wall=float(payload.get("wall", time.time())),
                    )

    async def _publish(self) -> None:
        r = self.rates
        while True:
            # asyncio.timeout, not wait_for: on 3.11 a wait_for cancelled (the view closing) as
            # its event is set can wait for ever for its inner task, and the close with it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(r.publish_interval_s):
                    await self._urgent.wait()
                await asyncio.sleep(r.urgent_s)  # the rest of a burst (a node going down)
            self._urgent.clear()
            diff = self.machine.diff()
            if diff:
                for listener in list(self._listeners):
                    listener(diff)


def _has(topology: Topology, kind: ServiceKind) -> bool:
    return any(x.kind is kind for x in topology.services)


def _sample(s: LinkStat) -> LinkSample:
    return LinkSample(
        link=s.link,
        kind=s.kind,
        capacity_gb_s=s.capacity_bytes_per_s / 1e9,
        bytes=s.bytes,
        utilization=s.utilization,
        active_flows=s.active_flows,
        up=s.up,
    )


def _link_json(s: LinkStat) -> Json:
    return {
        "link": s.link,
        "kind": s.kind,
        "bytes": s.bytes,
        "utilization": round(s.utilization, 4),
        "capacity_gb_s": round(s.capacity_bytes_per_s / 1e9, 3),
        "active_flows": s.active_flows,
        "up": s.up,
    }


def _serving_json(s: ServingStats) -> Json | None:
    """The router's aggregates, or None while nothing is deployed or served."""
    if not (s.kv_slots or s.requests_completed or s.requests_in_flight):
        return None
    return {
        "requests_completed": s.requests_completed,
        "requests_in_flight": s.requests_in_flight,
        "output_tokens_per_s": round(s.output_tokens_per_s, 1),
        "ttft_p50_ms": s.ttft.p50_ns / 1e6,
        "ttft_p99_ms": s.ttft.p99_ns / 1e6,
        "tpot_p50_ms": s.tpot.p50_ns / 1e6,
        "prefix_hit_share": (
            s.prefix_hit_tokens / s.prefix_lookup_tokens if s.prefix_lookup_tokens else 0.0
        ),
        "kv_slots_held": s.kv_slots_held,
        "kv_slots": s.kv_slots,
    }
