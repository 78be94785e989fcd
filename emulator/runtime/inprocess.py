"""The in-process launcher: a whole supernode as one server per device in one event loop.

This is the embedded default of `cmemu up`. It consumes the topology document as every launcher
does; it only adds the emulated-time epoch, at the moment the devices start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

import structlog
from google.protobuf.json_format import MessageToDict

from emulator.client import health
from emulator.model.clock import Clock
from emulator.model.errors import EmulatorError, NotFoundError
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.topology import ServiceKind, Topology
from emulator.runtime.events import EventBus
from emulator.runtime.security import NONE as NO_SECURITY
from emulator.runtime.security import Security
from services.auth import OPEN
from services.ems import EmsState, create_ems
from services.fabric import FabricState, create_fabric
from services.host import ServiceHost
from services.kinds import DeviceHandle, create_device
from services.peers import Peers

log = structlog.get_logger("cmemu.inprocess")


class InProcessSupernode:
    """Async context manager: on entry every hosted server is bound and verified SERVING over
    gRPC; on exit each turns NOT_SERVING, in-flight calls drain, and the servers stop.

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
        self.ems: EmsState | None = None
        self._ems_host: ServiceHost | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self.events: EventBus | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._stopping = asyncio.Event()
        self.profile = profile
        self.drain_s = drain_s
        self.ready_timeout_s = ready_timeout_s
        self.handles: dict[str, DeviceHandle] = {}
        self.fabric: FabricState | None = None
        self._hosts: list[ServiceHost] = []
        self._peers: Peers | None = None

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

    async def start(self) -> None:
        """Start the hosted servers. Emulated time starts now unless the topology document
        already carries the epoch (a process of a multi-process supernode)."""
        epoch = self.topology.epoch_wall_s or time.time()
        self.topology = dataclasses.replace(self.topology, epoch_wall_s=epoch)
        clock = Clock(time_scale=self.topology.time_scale, epoch_wall_s=epoch)
        self._clock = clock
        self._peers = Peers(self.topology, self.credentials)
        self._stopping.clear()
        tasks = self._tasks = asyncio.TaskGroup()  # owns the fabric clock and telemetry loops
        await tasks.__aenter__()
        if self.broker:
            self.events = await EventBus(
                self.broker,
                self.topology.supernode,
                # room for every hosted server's started, health and stopped events at once
                buffer_max=max(self.profile.limits.event_buffer_max, 4 * len(self.hosted)),
                **self.security.mqtt_login(),
            ).__aenter__()
        self.handles = {
            d.id: create_device(
                d,
                topology=self.topology,
                profile=self.profile,
                clock=clock,
                peers=self._peers,
                events=self.events,
            )
            for d in self.topology.devices
            if d.id in self.hosted
        }
        self._hosts = [h.host for h in self.handles.values()]
        service_hosts = []
        fabric = self.topology.service(ServiceKind.FABRIC)
        if fabric.id in self.hosted:
            self.fabric, fabric_host = create_fabric(
                address=fabric.address,
                topology=self.topology,
                profile=self.profile,
                clock=clock,
                peers=self._peers,
                events=self.events,
            )
            service_hosts.append(fabric_host)
            tasks.create_task(self.fabric.run(), name="fabric-clock")
        ems = self.topology.service(ServiceKind.EMS)
        if ems.id in self.hosted:
            if self.ems_ssd_dir is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="cmemu-ems-ssd-")
                self.ems_ssd_dir = Path(self._scratch.name)
            self.ems, self._ems_host = create_ems(
                address=ems.address,
                topology=self.topology,
                profile=self.profile,
                clock=clock,
                peers=self._peers,
                ssd_dir=self.ems_ssd_dir,
            )
        self._hosts += service_hosts
        if self._server_security != OPEN:
            for host in [*self._hosts, *([self._ems_host] if self._ems_host else [])]:
                host.secure(self._server_security)
        results = await asyncio.gather(
            *(h.start() for h in service_hosts),
            *(h.start() for h in self.handles.values()),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        for host in service_hosts:
            await host.set_serving(True)
        if self.ems is not None and self._ems_host is not None:
            # EMS serves once its index is rebuilt from the pools, which serve by now when in
            # this process (or are waited for, when they are other processes)
            await self._ems_host.start()
            self._hosts.append(self._ems_host)
            await self.ems.rebuild(self.ems_rebuild_wait_s)
            tasks.create_task(self.ems.run(), name="ems-sweep")
            await self._ems_host.set_serving(True)
        try:
            await self._verify_serving()
        except EmulatorError:
            await self.stop()
            raise
        self._announce("started", status="SERVING")
        if self.events is not None and self.handles:
            tasks.create_task(self._telemetry_loop(), name="telemetry")

    def _announce(self, event: str, **detail: str) -> None:
        if self.events is None:
            return
        now = self._clock.now_ns()
        for host in self._hosts:
            self.events.event(host.name, event, now, address=host.address, **detail)

    async def _telemetry_loop(self) -> None:
        """Every device's telemetry, every telemetry interval of emulated time, spread over the
        interval in small batches; ends when the supernode stops. One process publishes at most
        telemetry_max_per_s samples a second: past that (thousands of devices in one process, or
        a fast time_scale) the interval stretches rather than the process drowning in MQTT."""
        assert self.events is not None
        limits = self.profile.limits
        handles = list(self.handles.values())
        interval = max(
            self._clock.wall_delay_s(limits.telemetry_interval_s),
            len(handles) / limits.telemetry_max_per_s,
        )
        batch = 64
        pause = interval / max(1, -(-len(handles) // batch))
        # a stop before this task first ran has emptied the handles: nothing to wait for
        while handles and not self._stopping.is_set():
            for start in range(0, len(handles), batch):
                if await self._stopped_within(pause):
                    return
                for handle in handles[start : start + batch]:
                    try:
                        sample = MessageToDict(
                            handle.state.telemetry(), preserving_proto_field_name=True
                        )
                    except Exception:  # one device's bad sample must not end everyone's
                        log.exception("telemetry sample failed", device=handle.state.device.id)
                        continue
                    self.events.telemetry(handle.state.device.id, sample)

    async def _stopped_within(self, wall_s: float) -> bool:
        """Wait up to wall_s; True as soon as the supernode is stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wall_s):
                await self._stopping.wait()
        return self._stopping.is_set()

    async def _verify_serving(self) -> None:
        """Ask every hosted server over gRPC, as a client would: starting is not serving."""
        await health.wait_serving(
            [h.address for h in self._hosts],
            timeout_s=self.ready_timeout_s,
            credentials=self.credentials,
        )

    async def stop(self) -> None:
        self._stopping.set()
        if self._hosts:
            self._announce("health", status="NOT_SERVING")
        hosts, self._hosts, self.handles = self._hosts, [], {}
        if hosts:
            await asyncio.gather(*(h.set_serving(False) for h in hosts))
            await asyncio.sleep(self.drain_s)
        if self.fabric is not None:
            await self.fabric.close()
            self.fabric = None
        if self.ems is not None:
            await self.ems.close()
            self.ems = None
        if self._peers is not None:  # device-to-device channels first: no GOAWAY storm
            await self._peers.close()
            self._peers = None
        await asyncio.gather(*(h.server.stop(self.drain_s) for h in hosts))
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        if self.events is not None:
            now = self._clock.now_ns()
            for host in hosts:
                self.events.event(host.name, "stopped", now)
            await self.events.__aexit__(None, None, None)
            self.events = None
        if self._tasks is not None:  # the telemetry loop has seen _stopping and ended
            tasks, self._tasks = self._tasks, None
            await tasks.__aexit__(None, None, None)
