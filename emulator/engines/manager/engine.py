"""The cluster manager: the reference control plane's detection and actions, on domain types.

Detection: the liveness stream of every process of the supernode (liveness.py), judged in
emulated time: a crash, a device down or a die down fail at once; a device that stops answering
fails after `misses_to_fail` heartbeat intervals of its own process's emulated time; a process
that falls silent fails all it hosts. Slow devices: an NPU that arrives last at its collectives,
consistently and by a margin, is a straggler (stragglers.py reads the fabric's collective
arrivals; the judge is emulator/model/manager/straggler.py): an incident detected_by
"straggler", acted on as a failure; it returns to service once a diagnostic kernel runs at its
roofline again. What the manager does about an incident (isolate, replace, follow the restore)
is actions.py.

Everything it reaches goes through its ControlPlane (emulator/engines/peers.py): the devices
and the fabric (directly when they live in this process), the scheduler and the router, the
training jobs its server hosts. The servicer (services/manager.py) only translates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import answer_within
from cmemu.emulator.engines.device.npu import Kernel
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.manager.actions import Actions
from cmemu.emulator.engines.manager.link import Link, SeveredPlane
from cmemu.emulator.engines.manager.liveness import LivenessWatch
from cmemu.emulator.engines.manager.metrics import manager_families
from cmemu.emulator.engines.manager.status import ManagerStatus, Mode
from cmemu.emulator.engines.manager.stragglers import StragglerWatch
from cmemu.emulator.engines.peers import ControlPlane
from cmemu.emulator.model.costmodel import kernel_cost
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.manager.detector import (
    CLOSED,
    DEGRADED,
    DEGRADING,
    FAILED,
    RESTORED,
    SUSPECT,
    Detector,
    Incident,
)
from cmemu.emulator.model.naming import die_id, die_of, parse_supernode, service_id
from cmemu.emulator.model.topology import DeviceKind, ServiceKind, Topology

T = TypeVar("T")
log = structlog.get_logger("cmemu.manager")
DIAGNOSIS_KERNEL = "straggler-diagnosis"


class ManagerEngine:
    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: ControlPlane,
        events: EventSink | None,
        address: str,
    ) -> None:
        self.address = address  # its own server's: asked whether it still serves
        self.name = service_id(
            ServiceKind.MANAGER.value, supernode=parse_supernode(topology.supernode)
        )
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.link = Link()  # severed by a service-partition of the manager
        self.peers: ControlPlane = SeveredPlane(peers, self.link)
        self.events = events
        self.mode = Mode.ACTIVE
        self.detector = Detector()
        self.devices = {d.id: d for d in topology.devices}
        self.detector.watch(list(self.devices))
        self.watch = self._new_watch()
        self.stragglers = StragglerWatch(
            peers=self.peers,
            clock=clock,
            detector=self.detector,
            settings=profile.manager,
            npus=frozenset(d for d, x in self.devices.items() if x.kind is DeviceKind.NPU),
            probe=self._diagnosis,
            on_incident=self._incident,
            on_recovered=self._back,
        )
        self.actions = Actions(self)
        self._tasks: asyncio.TaskGroup | None = None
        self._children: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._ended = asyncio.Event()
        self._running = False

    def _new_watch(self) -> LivenessWatch:
        m = self.profile.manager
        return LivenessWatch(
            devices=self.devices,
            peers=self.peers,
            clock=self.clock,
            detector=self.detector,
            interval_s=m.heartbeat_interval_s,
            misses_to_fail=m.misses_to_fail,
            on_incident=self._incident,
            on_back=self._back,
            cut_off_share=m.cut_off_share,
            on_cut_off=self._cut_off,
        )

    def _cut_off(self, cut: bool, quiet: int) -> None:
        self.publish("cut-off" if cut else "rejoined", devices_silent=quiet)

    def partition(self, severed: bool) -> None:
        """service-partition of the manager: it runs on, reaching nothing (emulator/engines/
        manager/link.py) until healed."""
        if severed:
            self.link.sever()
        else:
            self.link.heal()
        self.publish("partitioned" if severed else "healed")

    async def checked(self, device: str, call: Awaitable[T]) -> T:
        """A call to a device, bounded as a heartbeat's check: `manager.heartbeat_deadline_s`
        of emulated time (engines/deadline.py; counted in wall seconds at the rate of its start,
        a starved host's slowed clock let it end before a healthy device's answer), never under
        `heartbeat_deadline_min_wall_s` of wall time; past it, DeadlineExceededError."""
        m = self.profile.manager
        return await answer_within(
            self.clock.clock, m.heartbeat_deadline_s, call,
            peer=device, min_wall_s=m.heartbeat_deadline_min_wall_s,
        )  # fmt: skip

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def publish(self, event: str, **detail: object) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Liveness streams, straggler reads and restore checks until close(). Everything ends
        before close() returns (before the launcher closes the channels they use)."""
        self._running = True
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                self._start_watching()
                try:
                    await self._closed.wait()
                finally:
                    self._tasks = None
                    for task in list(self._children):
                        task.cancel()
        finally:
            self._ended.set()

    async def close(self) -> None:
        self._closed.set()
        if self._running:
            await self._ended.wait()

    async def suspend(self) -> None:
        """The manager is killed or hung (service-kill, service-hang): its detection, its
        actions in flight and its restore checks stop where they are; its liveness streams
        go. What it recorded (incidents, device states, mode) is kept, as a manager that
        journals them would find it again on restart."""
        children = list(self._children)
        for task in children:
            task.cancel()
        await asyncio.gather(*children, return_exceptions=True)
        self.publish("suspended")

    def resume(self) -> None:
        """Back from service-kill or service-hang: new liveness streams (a device that failed
        meanwhile is judged on their first beats), the restore checks again."""
        self.watch = self._new_watch()
        self._start_watching()
        self.publish("resumed")

    def _start_watching(self) -> None:
        self.spawn(self.watch.run())
        self.spawn(self.stragglers.run())
        self.spawn(self.actions.restores())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A child task of run(), cancelled when the manager closes or is suspended."""
        tasks = self._tasks
        if tasks is None:
            coro.close()
            return
        task = tasks.create_task(self._guarded(coro))
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        task.add_done_callback(lambda _: coro.close())  # cancelled before it ran: no warning

    @staticmethod
    async def _guarded(coro: Coroutine[Any, Any, None]) -> None:
        """A bug in one action is logged; it does not stop the detection of every device."""
        try:
            await coro
        except Exception:
            log.exception("manager task failed")

    # --- detection -----------------------------------------------------------------------------

    def _back(self, target: str) -> None:
        """A failed device or die answers again (the liveness watch said so), or a straggler
        runs at its roofline again (the diagnosis said so)."""
        self.publish("device-back", target=target)
        now = self.clock.now_ns()
        for incident in self.detector.open_for(target):
            if not incident.jobs:  # nothing to restore: the device itself is the recovery
                incident.state, incident.restored_ns = RESTORED, now
        npu = self.npu_of(target)
        if self.mode is Mode.ACTIVE and npu is not None and self.whole(npu):
            self.spawn(self.actions.mark_healthy(npu))

    def failed(self, target: str) -> bool:
        """Out of service: failed, or degraded (a straggler)."""
        return self.detector.devices.get(target) in (FAILED, DEGRADED)

    def npu_of(self, target: str) -> str | None:
        """The NPU a device or die id belongs to (None: not an NPU)."""
        die = die_of(target) if target not in self.devices else None
        npu = die.device.id if die is not None else target
        device = self.devices.get(npu)
        return npu if device is not None and device.kind is DeviceKind.NPU else None

    def whole(self, npu: str) -> bool:
        """The NPU and every die of it answer: it may go back into service."""
        states = self.detector.devices
        return all(states.get(t) != FAILED for t in (npu, *self._dies(npu)))

    def _dies(self, npu: str) -> list[str]:
        return [die_id(npu, k) for k in range(self.profile.npu.dies)]

    def _incident(self, incident: Incident) -> None:
        if incident.detected_by in DEGRADING:  # alive, its dies answer: nothing to fold
            self.publish(incident.detected_by, target=incident.device, detail=incident.detail)
        elif incident.device in self.devices:
            parts = self._dies(incident.device) if self.npu_of(incident.device) else []
            self.detector.fold(incident.device, parts)
        self.spawn(self.actions.act(incident))

    async def _diagnosis(self, npu: str) -> float:
        """A diagnostic kernel on every die of `npu`: the worst achieved time over the
        roofline's (a slowed die computes at its share: 1/share)."""
        m = self.profile.manager
        peer = self.peers.device(self.devices[npu])
        nominal = kernel_cost(m.straggler_probe_flops, 0, "BF16", self.profile).duration_ns
        worst = 0.0
        for die in range(self.profile.npu.dies):
            kernel = Kernel(
                name=DIAGNOSIS_KERNEL,
                die=die,
                flops=m.straggler_probe_flops,
                bytes_moved=0,
                precision="BF16",
            )
            done = await self.checked(npu, peer.kernel(kernel, deadline_s=None))
            worst = max(worst, done.duration_ns / max(1, nominal))
        return worst

    # --- what it shows -------------------------------------------------------------------------

    def metrics(self) -> Iterable[Family]:
        """What the manager costs and finds, for Prometheus (read at each scrape)."""
        return manager_families(self)

    def status(self) -> ManagerStatus:
        d = self.detector
        m = self.profile.manager
        return ManagerStatus(
            mode=self.mode,
            devices_watched=len(self.devices),
            devices_suspect=sum(d.devices.get(x) == SUSPECT for x in self.devices),
            devices_failed=sum(d.devices.get(x) == FAILED for x in self.devices),
            heartbeat_interval_s=m.heartbeat_interval_s,
            misses_to_fail=m.misses_to_fail,
            open_incidents=sum(1 for i in d.incidents if i.state not in CLOSED),
            liveness_streams=self.watch.streams,
            devices_covered=self.watch.devices_covered,
        )
