"""The cluster manager (cmemu.v1.ClusterManager): the reference control plane.

Detection: the liveness stream of every process of the supernode (one per process, whatever
its devices: emulator/engines/manager/liveness.py), judged in emulated time: a crash, a device
down or a die down fail at once; a device that stops answering fails after `misses_to_fail`
heartbeat intervals of its own process's emulated time; a process that falls silent fails all
it hosts. Slow devices: an NPU that arrives last at its collectives, consistently and by a
margin, is a straggler (emulator/engines/manager/stragglers.py reads the fabric's collective
arrivals; the judge is emulator/model/manager/straggler.py): an incident detected_by
"straggler", acted on as a failure; it returns to service once a diagnostic kernel runs at its
roofline again. Isolation: Scheduler/MarkFailed. Replacement: Scheduler/Replace for every job
holding the NPU. Restore is the workloads' own (they watch their allocation); the manager only
notes it in the incident once the workload reports it (Training/Get, Router/GetDeployment). In
PASSIVE mode it detects and records, and acts on nothing. The training jobs are hosted on the same
server (their state apart).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.v1 import (
    device_pb2,
    manager_pb2,
    manager_pb2_grpc,
    npu_pb2,
    npu_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    training_pb2_grpc,
)
from emulator.engines.clock import Timeline
from emulator.engines.events import EventSink
from emulator.engines.manager.liveness import LivenessWatch
from emulator.engines.manager.stragglers import StragglerWatch
from emulator.model.costmodel import kernel_cost
from emulator.model.errors import InvalidArgumentError
from emulator.model.hardware import HardwareProfile
from emulator.model.instruments import Family
from emulator.model.manager.detector import (
    CLOSED,
    DEGRADED,
    FAILED,
    ISOLATED,
    REPLACED,
    RESTORED,
    STATES,
    STRAGGLER,
    SUSPECT,
    UNRECOVERABLE,
    Detector,
    Incident,
)
from emulator.model.naming import die_id, die_of, parse_supernode, service_id
from emulator.model.topology import Device, DeviceKind, ServiceKind, Topology
from services.host import ServiceHost
from services.peers import Peers
from services.status import Context, RemoteError, rpc
from services.training.service import SERVICE as TRAINING_SERVICE
from services.training.service import TrainingServicer, TrainingState

SERVICE = "cmemu.v1.ClusterManager"
TRAINING_TOPIC = "training"  # the training jobs' events: cmemu/<supernode>/training/events
log = structlog.get_logger("cmemu.manager")
OWN_HEALTH_WALL_S = 2.0  # its own server's health answers at once, but for a stalled host
ACTIVE, PASSIVE = manager_pb2.MANAGER_MODE_ACTIVE, manager_pb2.MANAGER_MODE_PASSIVE
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ManagerState:
    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Peers,
        events: EventSink | None,
        address: str,
    ) -> None:
        self.address = address
        self.name = service_id(
            ServiceKind.MANAGER.value, supernode=parse_supernode(topology.supernode)
        )
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.events = events
        self.mode: manager_pb2.ManagerMode.ValueType = ACTIVE
        self.detector = Detector()
        self.devices = {d.id: d for d in topology.devices}
        self.detector.watch(list(self.devices))
        self.watch = self._new_watch()
        self.stragglers = StragglerWatch(
            peers=peers,
            clock=clock,
            detector=self.detector,
            settings=profile.manager,
            npus=frozenset(d for d, x in self.devices.items() if x.kind is DeviceKind.NPU),
            probe=self._diagnosis,
            on_incident=self._incident,
            on_recovered=self._back,
        )
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(
            peers.channel(topology.service(ServiceKind.SCHEDULER).address)
        )
        self.router = router_pb2_grpc.RouterStub(
            peers.channel(topology.service(ServiceKind.ROUTER).address)
        )
        self.training = TrainingState(
            topology=topology,
            profile=profile,
            clock=clock,
            peers=peers,
            events=events,
            topic=TRAINING_TOPIC,
        )
        self._inflight: set[str] = set()
        self._tasks: asyncio.TaskGroup | None = None
        self._children: set[asyncio.Task[None]] = set()
        self._die_watches: dict[str, asyncio.Task[None]] = {}
        self._closed = asyncio.Event()
        self._ended = asyncio.Event()
        self._running = False
        self.heartbeats_sent = 0

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
        )

    @property
    def _deadline(self) -> float:
        """A heartbeat's deadline in wall seconds."""
        m = self.profile.manager
        return max(
            self.clock.clock.wall_delay_s(m.heartbeat_deadline_s), m.heartbeat_deadline_min_wall_s
        )

    def publish(self, event: str, **detail: object) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Heartbeats, health streams and restore checks until close(); the training jobs'
        own run beside them. Everything ends before close() returns (before the launcher
        closes the channels they use)."""
        self._running = True
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                training = tasks.create_task(self.training.run())
                self._spawn(self.watch.run())
                self._spawn(self.stragglers.run())
                self._spawn(self._restores())
                try:
                    await self._closed.wait()
                finally:
                    self._tasks = None
                    for task in list(self._children):
                        task.cancel()
                    await self.training.close()
                    await training
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
        journals them would find it again on restart. The training jobs it hosts run on: they
        are the workload, on their NPUs, not the controller."""
        children = list(self._children)
        for task in children:
            task.cancel()
        await asyncio.gather(*children, return_exceptions=True)
        self.publish("suspended")

    def resume(self) -> None:
        """Back from service-kill or service-hang: new liveness streams (a device that failed
        meanwhile is judged on their first beats), the restore checks again."""
        self.watch = self._new_watch()
        self._spawn(self.watch.run())
        self._spawn(self.stragglers.run())
        self._spawn(self._restores())
        self.publish("resumed")

    # --- detection -----------------------------------------------------------------------------

    def _back(self, target: str) -> None:
        """A failed device or die answers again (the liveness watch said so)."""
        self.publish("device-back", target=target)
        now = self.clock.now_ns()
        for incident in self.detector.open_for(target):
            if not incident.jobs:  # nothing to restore: the device itself is the recovery
                incident.state, incident.restored_ns = RESTORED, now
        npu = self._npu_of(target)
        if self.mode == ACTIVE and npu is not None and self._whole(npu):
            self._spawn(self._mark_healthy(npu))

    def _failed(self, target: str) -> bool:
        """Out of service: failed, or degraded (a straggler)."""
        return self.detector.devices.get(target) in (FAILED, DEGRADED)

    def _npu_of(self, target: str) -> str | None:
        """The NPU a device or die id belongs to (None: not an NPU)."""
        die = die_of(target) if target not in self.devices else None
        npu = die.device.id if die is not None else target
        device = self.devices.get(npu)
        return npu if device is not None and device.kind is DeviceKind.NPU else None

    def _whole(self, npu: str) -> bool:
        """The NPU and every die of it answer: it may go back into service."""
        states = self.detector.devices
        return all(states.get(t) != FAILED for t in (npu, *self._dies(npu)))

    def _dies(self, npu: str) -> list[str]:
        return [die_id(npu, k) for k in range(self.profile.npu.dies)]

    def _incident(self, incident: Incident) -> None:
        if incident.detected_by == STRAGGLER:  # its dies answer: nothing to fold
            self.publish("straggler", target=incident.device, detail=incident.detail)
        elif incident.device in self.devices:
            self.detector.fold(self._dies(incident.device) if self._npu_of(incident.device) else [])
        self._spawn(self._act(incident))

    async def _diagnosis(self, npu: str) -> float:
        """A diagnostic kernel on every die of `npu`: the worst achieved time over the
        roofline's (a slowed die computes at its share: 1/share)."""
        m = self.profile.manager
        stub = npu_pb2_grpc.NpuStub(self.peers.channel(self.devices[npu].address))
        nominal = kernel_cost(m.straggler_probe_flops, 0, "BF16", self.profile).duration_ns
        worst = 0.0
        for die in range(self.profile.npu.dies):
            kernel = npu_pb2.Kernel(
                name="straggler-diagnosis",
                die=die,
                flops=m.straggler_probe_flops,
                precision=npu_pb2.PRECISION_BF16,
            )
            try:
                done = await stub.SubmitKernel(kernel, timeout=self._deadline)
            except grpc.aio.AioRpcError as exc:
                raise RemoteError.from_rpc_error(exc, npu) from exc
            worst = max(worst, done.duration_ns / max(1, nominal))
        return worst

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A child task of run(), cancelled when the manager closes."""
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

    # --- isolation and replacement -------------------------------------------------------------

    async def _act(self, incident: Incident) -> None:
        """Isolate and replace: a die down takes its whole NPU out (the scheduler hands out
        NPUs; a serving deployment isolates the die itself when it sees the NPU failed)."""
        if await self._stopping():
            incident.detail += " (the supernode is stopping: not acted on)"
            return
        log.warning("device failed", device=incident.device, by=incident.detected_by)
        self.publish(
            "incident",
            incident=incident.id,
            target=incident.device,
            detected_by=incident.detected_by,
            detail=incident.detail,
        )
        npu = self._npu_of(incident.device)
        device = self.devices[npu or incident.device]
        self._spawn(self._fault_since(incident, device))  # a hung device makes it wait
        if not self._failed(incident.device):
            incident.detail += " (back before it was acted on)"
            return
        if self.mode != ACTIVE:
            incident.detail += " (passive: recorded only)"
            return
        if npu is None:
            incident.detail += f" ({device.kind.value}: no scheduler resource to replace)"
            return
        try:
            marked = await self.scheduler.MarkFailed(scheduler_pb2.MarkRequest(npu=device.id))
            back = not self._failed(incident.device)
            if back and self._whole(device.id):
                await self._mark_healthy(device.id)  # it came back meanwhile: undo
            incident.isolated_ns = self.clock.now_ns()
            incident.jobs = list(marked.affected_jobs)
            self.publish(
                "incident-isolated", incident=incident.id, target=device.id, jobs=incident.jobs
            )
            if back and not incident.jobs:
                # Back while MarkFailed was in flight (a partition shorter than the isolation):
                # _back restored the incident then, and no job needs a replacement. Marked
                # isolated now, nothing would ever move it on (the device answers already).
                incident.state = RESTORED
                incident.restored_ns = incident.restored_ns or incident.isolated_ns
                incident.detail += " (back while it was isolated)"
                return
            incident.state = ISOLATED
            for job in incident.jobs:
                reply = await self.scheduler.Replace(
                    scheduler_pb2.ReplaceRequest(job=job, npu=device.id)
                )
                incident.replacements.extend(r.new_npu for r in reply.replaced)
            if incident.jobs:
                incident.state, incident.replaced_ns = REPLACED, self.clock.now_ns()
                self.publish(
                    "incident-replaced",
                    incident=incident.id,
                    target=device.id,
                    replacements=incident.replacements,
                )
        except grpc.aio.AioRpcError as exc:
            incident.state = UNRECOVERABLE
            incident.detail += f"; {exc.code().name}: {exc.details()}"
            self.publish("incident-unrecoverable", incident=incident.id, error=exc.details() or "")

    async def _stopping(self) -> bool:
        """The manager's own server no longer serves: the launcher is stopping every server,
        and their NOT_SERVING is no fault to act on."""
        stub = health_pb2_grpc.HealthStub(self.peers.channel(self.address))
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=OWN_HEALTH_WALL_S)
        except grpc.aio.AioRpcError:
            return True
        return bool(reply.status != SERVING)

    async def _fault_since(self, incident: Incident, device: Device) -> None:
        """When the device says its fault began (left 0 when it cannot say: crashed, hung)."""
        with contextlib.suppress(RemoteError):
            state = await self.peers.device_call(
                device, "GetFaultState", device_pb2.GetFaultStateRequest(), deadline_s=1.0
            )
            if state.faulted:
                incident.fault_ns = int(state.since_ns)

    async def _mark_healthy(self, npu: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.scheduler.MarkHealthy(scheduler_pb2.MarkRequest(npu=npu))

    # --- restore -------------------------------------------------------------------------------

    async def _restores(self) -> None:
        """Replaced incidents become restored once every job concerned reports its restore."""
        while not self._closed.is_set():
            for incident in self.detector.incidents:
                if incident.state == REPLACED:
                    done = [await self._restored_ns(j, incident.replaced_ns) for j in incident.jobs]
                    if all(done):
                        incident.state, incident.restored_ns = RESTORED, max(done)
                        self.publish("incident-restored", incident=incident.id, jobs=incident.jobs)
            await self.clock.sleep(self.profile.manager.heartbeat_interval_s / 4)

    async def _restored_ns(self, job: str, after_ns: int) -> int:
        live = self.training.jobs.get(job)
        if live is not None:
            at = live.progress.last_restored_ns
            return at if at >= after_ns else 0
        deployment = job.rsplit(".", 1)[0]
        try:
            d = await self.router.GetDeployment(router_pb2.GetDeploymentRequest(name=deployment))
        except grpc.aio.AioRpcError:
            return 0
        at = d.last_restored_ns
        return at if at >= after_ns else 0

    # --- metrics -------------------------------------------------------------------------------

    def metrics(self) -> Iterable[Family]:
        """What the manager costs and finds, for Prometheus (read at each scrape)."""
        states = self.detector.devices
        by_state: dict[str, int] = {}
        for incident in self.detector.incidents:
            by_state[incident.state] = by_state.get(incident.state, 0) + 1
        yield Family(
            name="cmemu_manager_liveness_beats_total",
            help="Liveness beats the cluster manager has received (one per process per beat)",
            type="counter",
            samples=[({}, float(self.watch.beats))],
        )
        yield Family(
            name="cmemu_manager_liveness_streams",
            help="Liveness streams the cluster manager has opened (one per process)",
            type="counter",
            samples=[({}, float(self.watch.streams))],
        )
        yield Family(
            name="cmemu_manager_devices",
            help="Devices the cluster manager watches, by detection state",
            type="gauge",
            samples=[
                ({"state": st}, float(sum(states.get(d) == st for d in self.devices)))
                for st in STATES
            ],
        )
        s = self.stragglers
        yield Family(
            name="cmemu_manager_stragglers_detected_total",
            help="NPUs the cluster manager found arriving last at their collectives (stragglers)",
            type="counter",
            samples=[({}, float(s.detected))],
        )
        yield Family(
            name="cmemu_manager_collective_arrivals_total",
            help="Collectives whose ranks' arrivals the cluster manager has judged",
            type="counter",
            samples=[({}, float(s.arrivals))],
        )
        yield Family(
            name="cmemu_manager_incidents",
            help="Incidents the cluster manager has recorded, by state",
            type="gauge",
            samples=[({"state": st}, float(n)) for st, n in sorted(by_state.items())],
        )

    # --- status --------------------------------------------------------------------------------

    def status(self) -> manager_pb2.ManagerStatus:
        d = self.detector
        m = self.profile.manager
        return manager_pb2.ManagerStatus(
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


def incident_message(i: Incident) -> manager_pb2.Incident:
    return manager_pb2.Incident(
        id=i.id,
        device=i.device,
        detected_by=i.detected_by,
        state=i.state,
        fault_ns=i.fault_ns,
        detected_ns=i.detected_ns,
        isolated_ns=i.isolated_ns,
        replaced_ns=i.replaced_ns,
        restored_ns=i.restored_ns,
        jobs=i.jobs,
        replacements=i.replacements,
        detail=i.detail,
    )


class ManagerServicer(manager_pb2_grpc.ClusterManagerServicer):
    def __init__(self, state: ManagerState) -> None:
        self.state = state

    @rpc
    async def GetStatus(
        self, request: manager_pb2.GetManagerStatusRequest, context: Context
    ) -> manager_pb2.ManagerStatus:
        return self.state.status()

    @rpc
    async def ListIncidents(
        self, request: manager_pb2.ListIncidentsRequest, context: Context
    ) -> manager_pb2.ListIncidentsResponse:
        return manager_pb2.ListIncidentsResponse(
            incidents=[incident_message(i) for i in self.state.detector.since(request.since_ns)]
        )

    @rpc
    async def SetMode(
        self, request: manager_pb2.SetModeRequest, context: Context
    ) -> manager_pb2.ManagerStatus:
        if request.mode not in (ACTIVE, PASSIVE):
            raise InvalidArgumentError(
                "mode must be MANAGER_MODE_ACTIVE or MANAGER_MODE_PASSIVE", field="mode"
            )
        self.state.mode = request.mode
        self.state.publish("mode", mode=manager_pb2.ManagerMode.Name(request.mode))
        return self.state.status()


def create_manager(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None,
) -> tuple[ManagerState, ServiceHost]:
    state = ManagerState(
        topology=topology, profile=profile, clock=clock, peers=peers, events=events, address=address
    )
    servicer = ManagerServicer(state)
    training = TrainingServicer(state.training)
    host = ServiceHost(
        name=state.name,
        address=address,
        services=[
            (SERVICE, lambda s: manager_pb2_grpc.add_ClusterManagerServicer_to_server(servicer, s)),
            (
                TRAINING_SERVICE,
                lambda s: training_pb2_grpc.add_TrainingServicer_to_server(training, s),
            ),
        ],
    )
    return state, host
