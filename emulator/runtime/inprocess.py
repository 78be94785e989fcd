"""The in-process launcher: a whole supernode as one server per device in one event loop.

This is the embedded default of `cmemu up`. It consumes the topology document as every launcher
does; it only adds the emulated-time epoch, at the moment the devices start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, cast

import structlog

from cmemu.emulator.client import health
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.engines.device import faults as device_faults
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.engines.device.liveness import Liveness
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, UnavailableError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime import heap
from cmemu.emulator.runtime.devicehost import host_devices
from cmemu.emulator.runtime.events import EventBus
from cmemu.emulator.runtime.memdebug import MemDebug
from cmemu.emulator.runtime.metricserver import MetricsServer, open_metrics
from cmemu.emulator.runtime.registry import (
    DEVICE_WAVE,
    SERVICE_SPECS,
    ServiceContext,
    ServiceState,
)
from cmemu.emulator.runtime.security import NONE as NO_SECURITY
from cmemu.emulator.runtime.security import Security
from cmemu.emulator.runtime.servicecontrol import LocalServices
from cmemu.emulator.runtime.telemetry import publish_telemetry
from cmemu.services.auth import OPEN
from cmemu.services.host import SERVING, ServiceHost
from cmemu.services.kinds import DeviceServer
from cmemu.services.peers import Peers

if TYPE_CHECKING:  # imported by the processes that host them (runtime/registry.py)
    from cmemu.emulator.engines.ems import EmsState
    from cmemu.emulator.engines.fabric.engine import FabricEngine

log = structlog.get_logger("cmemu.inprocess")

# How often the launch re-reads the health of a server of its own that is not SERVING yet (its
# own health servicer, no call), until the ready timeout.
VERIFY_POLL_S = 0.05
# wall seconds a start waits for its `started` events to reach the broker (EventBus.sent): cm384's
# 629 took 0.1-0.2 s over MQTT; a broker slower than this gets the rest later
ANNOUNCE_WAIT_S = 5.0


def _status_name(served: int | None) -> str:
    """A server's health as the wire's check names it (client/health.py)."""
    return health.UNREACHABLE if served is None else health.status_name(served)


async def verify_hosts(
    hosts: list[ServiceHost], timeout_s: float, credentials: Credentials
) -> None:
    """Every hosted server serves by its own health (the status its Health/Check answers),
    and one server of each kind answers a Check over gRPC as a client would: starting is not
    serving, and the wire proves what every server of a kind shares (its transport, its
    guard: TLS, the token, the hang gate). Asking all of cm384's 629 over the wire cost a
    fifth of the boot's CPU (issue 18) and proved nothing more: each bound its own port with
    SO_REUSEPORT off (services/host.py), so no other process answers in its place."""
    deadline = time.monotonic() + timeout_s
    while laggards := [h for h in hosts if h.served != SERVING]:
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{h.address} {_status_name(h.served)}" for h in laggards[:5])
            more = f" and {len(laggards) - 5} more" if len(laggards) > 5 else ""
            raise UnavailableError(f"{len(laggards)} servers not SERVING: {shown}{more}")
        await asyncio.sleep(VERIFY_POLL_S)
    one_of_each = {host.kind: host for host in hosts}
    await health.wait_serving(
        [h.address for h in one_of_each.values()],
        timeout_s=max(0.0, deadline - time.monotonic()),
        credentials=credentials,
    )


async def _stop_servers(hosts: list[ServiceHost], grace_s: float) -> None:
    """Stop every server at once. grpc.aio's shutdown can end in a CancelledError of its own
    (it cancels its RPC tasks, then waits on them): that server is stopped all the same. A
    cancellation of this stop itself still raises, out of the gather."""
    stopped = await asyncio.gather(*(h.stop_server(grace_s) for h in hosts), return_exceptions=True)
    for outcome in stopped:
        if isinstance(outcome, asyncio.CancelledError):
            log.debug("server stop ended by its own cancelled tasks")
        elif isinstance(outcome, BaseException):
            raise outcome


class InProcessSupernode:
    """Async context manager: on entry every hosted server is bound and verified SERVING (by its
    own health, and one of each kind over gRPC); on exit each turns NOT_SERVING, in-flight calls
    drain, and the servers stop.

    It hosts the whole topology (the embedded default of `cmemu up`) or, for `cmemu serve`, the
    part named by `hosted` (device and service ids): one device, one node, or the fabric. The
    others are reached over gRPC at their topology addresses."""

    def __init__(
        self,
        topology: Topology,
        *,
        hosted: Collection[str] | None = None,
        profile: HardwareProfile = DEFAULT_PROFILE,
        drain_s: float = 0.2,
        ready_timeout_s: float = 60.0,
        broker: str | None = None,
        ems_ssd_dir: Path | None = None,
        ems_rebuild_wait_s: float = 30.0,
        security: Security = NO_SECURITY,
        time: TimeKeeper | None = None,
        process: str = "inprocess",
    ) -> None:
        everything = [d.id for d in topology.devices] + [x.id for x in topology.services]
        self.hosted = set(everything if hosted is None else hosted)
        unknown = self.hosted - set(everything)
        if unknown:
            raise NotFoundError(f"not in the topology: {', '.join(sorted(unknown))}")
        self.topology = topology
        self.broker = broker or topology.broker
        self.ems_ssd_dir = ems_ssd_dir
        self.ems_rebuild_wait_s = ems_rebuild_wait_s
        self.security = security  # the servers' token and TLS, and what peers present
        self._server_security = security.server()
        self.credentials = security.credentials()
        # the supernode-wide services hosted here, in start order, with their servers
        self.services: dict[ServiceKind, tuple[ServiceState, ServiceHost]] = {}
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self.events: EventBus | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._stopping = asyncio.Event()
        self.profile = profile
        self.drain_s = drain_s
        self.ready_timeout_s = ready_timeout_s
        self.devices: dict[str, DeviceEngine] = {}
        self.device_servers: dict[str, DeviceServer] = {}  # by id (the web view hears them)
        self._hosts: list[ServiceHost] = []
        self._peers: Peers | None = None
        self.metrics: MetricsServer | None = None  # this process's GET /metrics
        self._siblings: device_faults.Siblings | None = None
        self.liveness: Liveness | None = None  # what the cluster manager watches
        # this process's emulated time: given (several supernodes in one process share one),
        # or made here (`cmemu serve`, a lone supernode) and run by this supernode
        self.time: TimeKeeper | None = time
        self._own_time = time is None
        self._time_task: asyncio.Task[None] | None = None
        self.process = process

    @property
    def fabric(self) -> FabricEngine | None:
        return cast("FabricEngine | None", self.service_state(ServiceKind.FABRIC))

    @property
    def ems(self) -> EmsState | None:
        return cast("EmsState | None", self.service_state(ServiceKind.EMS))

    def service_state(self, kind: ServiceKind) -> ServiceState | None:
        """A hosted service's state (for tests and benchmarks that look inside)."""
        return self.services.get(kind, (None, None))[0]

    async def __aenter__(self) -> InProcessSupernode:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def owns_time(self) -> bool:
        """This process owns emulated time when it hosts sn0's fabric (or everything)."""
        fabric = self.topology.service(ServiceKind.FABRIC).id
        return fabric in self.hosted and (
            self.topology.scaleout is None or self.topology.index == 0
        )

    def _make_time(self, epoch: float) -> TimeKeeper:
        clock = Clock(time_scale=self.topology.time_scale, epoch_wall_s=epoch)
        profile = dataclasses.replace(self.profile.clock, dilation=self.topology.dilation)
        return TimeKeeper(clock, profile=profile, process=self.process, owner=self.owns_time())

    async def start(self) -> None:
        """Start the hosted servers, with no cyclic collection meanwhile (runtime/heap.py).
        Emulated time starts now unless the document carries the epoch (procs: one of many)."""
        with heap.starting():
            await self._start()

    async def _start(self) -> None:
        epoch = self.topology.epoch_wall_s or time.time()
        self.topology = dataclasses.replace(self.topology, epoch_wall_s=epoch)
        if self.time is None:
            self.time = self._make_time(epoch)
        keeper = self.time
        self._clock = keeper.timeline
        self.metrics = await open_metrics(self)  # None when the topology has no metrics port
        peers = self._peers = Peers(self.topology, self.credentials)
        self._stopping.clear()
        tasks = self._tasks = asyncio.TaskGroup()  # owns the clocks and telemetry loops
        await tasks.__aenter__()
        if self._own_time:
            source = (
                None
                if keeper.authority is not None
                else peers.clock_source(_clock_topology(self.topology))
            )
            self._time_task = tasks.create_task(keeper.run(source), name="emulated-time")
        if self.broker:
            self.events = await EventBus(
                self.broker,
                self.topology.supernode,
                # room for every hosted server's started, health and stopped events at once
                buffer_max=max(self.profile.limits.event_buffer_max, 4 * len(self.hosted)),
                **self.security.mqtt_login(),
            ).__aenter__()
        self._make_devices(keeper, peers)
        contexts = self._make_services(keeper, peers)
        if self._server_security != OPEN:
            for host in [*self._hosts, *(h for _, h in self.services.values())]:
                host.secure(self._server_security)
        early = [
            (kind, host)
            for kind, (_, host) in self.services.items()
            if SERVICE_SPECS[kind].wave < DEVICE_WAVE
        ]
        results = await asyncio.gather(
            *(h.start() for _, h in early),
            *(server.start() for server in self.device_servers.values()),
            return_exceptions=True,
        )
        self._hosts += [h for _, h in early]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        if keeper.follower is not None and self._own_time:
            await self._synced(keeper)
        for kind, (state, host) in self.services.items():
            spec = SERVICE_SPECS[kind]
            if spec.wave > DEVICE_WAVE:  # after the devices: they serve by now (or are waited
                await host.start()  # for, when they are other processes)
                self._hosts.append(host)
            if spec.prepare is not None:
                await spec.prepare(state, contexts[kind])
            tasks.create_task(state.run(), name=f"{kind.value}-run")
            await host.set_serving(True)
        try:
            await self.verify_serving()
        except EmulatorError:
            await self.stop()
            raise
        await _announced(self)
        self._background(tasks)

    def _background(self, tasks: asyncio.TaskGroup) -> None:
        """What runs while the servers serve: telemetry, heap trimming, the memory probe."""
        if self.events is not None and self.devices:
            telemetry = publish_telemetry(
                list(self.devices.values()),
                events=self.events,
                clock=self._clock,
                limits=self.profile.limits,
                stopping=self._stopping,
            )
            tasks.create_task(telemetry, name="telemetry")
        tasks.create_task(
            heap.trim_every(self.profile.limits.heap_trim_interval_s, self._stopping),
            name="heap-trim",
        )
        probe = MemDebug.from_env(os.environ)  # None unless $CMEMU_MEMDEBUG asks for it
        if probe is not None:
            probe.start(tasks, self._stopping)

    def _make_devices(self, keeper: TimeKeeper, peers: Peers) -> None:
        made = host_devices(
            self.topology, self.hosted, profile=self.profile, keeper=keeper, peers=peers,
            events=self.events, process=self.process,
        )  # fmt: skip
        self.devices, self.device_servers, self.liveness = made.engines, made.servers, made.liveness
        self._siblings = made.siblings
        self._siblings.services = LocalServices(self)  # service-kill and -hang go through them
        self._hosts = [x.host for x in self.device_servers.values()]

    def _make_services(self, keeper: TimeKeeper, peers: Peers) -> dict[ServiceKind, ServiceContext]:
        """The hosted supernode-wide services, in start order (runtime/registry.py)."""
        contexts = {}
        hosted = [x for x in self.topology.services if x.id in self.hosted]
        for service in sorted(hosted, key=lambda x: SERVICE_SPECS[x.kind].wave):
            spec = SERVICE_SPECS[service.kind]
            ctx = ServiceContext(
                service=service,
                topology=self.topology,
                profile=self.profile,
                time=keeper,
                peers=peers,
                events=self.events,
                data_dir=self._data_dir() if spec.keeps_files else Path(),
                rebuild_wait_s=self.ems_rebuild_wait_s,
            )
            self.services[service.kind] = spec.create(ctx)
            contexts[service.kind] = ctx
        return contexts

    async def _synced(self, keeper: TimeKeeper) -> None:
        """A follower serves once it follows the owner's clock (or, if the owner does not answer
        within the ready timeout, serves with its time held at 0 until the owner answers:
        emulated time is the owner's, and a guess would run ahead of it)."""
        assert keeper.follower is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.ready_timeout_s):
                await keeper.follower.synced.wait()

    def _data_dir(self) -> Path:
        """EMS's SSD tier: the directory given, else a scratch one for this supernode's life."""
        if self.ems_ssd_dir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="cmemu-ems-ssd-")
            self.ems_ssd_dir = Path(self._scratch.name)
        return self.ems_ssd_dir

    def _announce(self, event: str, **detail: str) -> None:
        if self.events is None:
            return
        now = self._clock.now_ns()
        for host in self._hosts:
            self.events.event(host.name, event, now, address=host.address, **detail)

    async def verify_serving(self) -> None:
        """Every hosted server serves (verify_hosts), within the ready timeout."""
        await verify_hosts(self._hosts, self.ready_timeout_s, self.credentials)

    async def not_serving(self) -> None:
        """Every hosted server's health NOT_SERVING at once: the first thing a stop does, so
        that clients and load balancers see it before anything else is torn down."""
        await asyncio.gather(*(h.set_serving(False) for h in self._hosts))

    async def stop(self) -> None:
        self._stopping.set()
        if self._siblings is not None:  # no fault timer restarts a server from here on
            device_faults.close(self._siblings)
            self._siblings = None
        for server in self.device_servers.values():
            server.close()
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None
        if self._hosts:
            self._announce("health", status="NOT_SERVING")
        hosts, self._hosts = self._hosts, []
        self.devices, self.device_servers = {}, {}
        if hosts:
            await asyncio.gather(*(h.set_serving(False) for h in hosts))
            await asyncio.sleep(self.drain_s)
        services, self.services = self.services, {}
        for state, _ in reversed(services.values()):  # the last started first
            await state.close()
        if self._peers is not None:  # device-to-device channels first: no GOAWAY storm
            await self._peers.close()
            self._peers = None
        await _stop_servers(hosts, self.drain_s)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        if self.events is not None:
            now = self._clock.now_ns()
            for host in hosts:
                self.events.event(host.name, "stopped", now)
            await self.events.__aexit__(None, None, None)
            self.events = None
        await self._end_tasks()
        heap.stopped()

    async def _end_tasks(self) -> None:
        """The background tasks end: the telemetry loop has seen _stopping, the clock is
        cancelled (it runs until then)."""
        if self._tasks is None:
            return
        tasks, self._tasks = self._tasks, None
        if self._time_task is not None:
            self._time_task.cancel()
            self._time_task = None
        await tasks.__aexit__(None, None, None)
        if self._own_time and self.time is not None:
            self.time.close()


async def _announced(supernode: InProcessSupernode) -> None:
    """Every server of a start announced SERVING, and the announcements at the broker before the
    start returns, not beside the first calls it serves (EventBus.sent)."""
    supernode._announce("started", status="SERVING")
    if supernode.events is not None:
        await supernode.events.sent(ANNOUNCE_WAIT_S)


def _clock_topology(topology: Topology) -> Topology:
    """The document whose fabric owns emulated time: sn0's (its address is in the plane)."""
    plane = topology.scaleout
    if plane is None or topology.index == 0:
        return topology
    return dataclasses.replace(
        topology,
        services=tuple(
            dataclasses.replace(x, address=plane.clock) if x.kind is ServiceKind.FABRIC else x
            for x in topology.services
        ),
    )
