"""The cluster manager's server (cmemu.v1.ClusterManager, and cmemu.v1.Training beside it).

The manager itself (detection, isolation, replacement, restores, suspend and resume) is its
engine, emulator/engines/manager/engine.py, on domain types; this module only translates its
incidents, status and mode to and from protobuf, and hosts the training jobs (their engine,
emulator/engines/training/, served by services/training/) on the same server, answering the
manager engine's and the scheduler's day plans' questions about them directly
(Peers.host_training; the day plans through the server's outage).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.manager.engine import ManagerEngine
from cmemu.emulator.engines.manager.status import ManagerStatus, Mode
from cmemu.emulator.engines.training.engine import TrainingEngine
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.manager.detector import Incident
from cmemu.emulator.model.topology import Topology
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, rpc
from cmemu.services.training.service import SERVICE as TRAINING_SERVICE
from cmemu.services.training.service import TrainingServicer, create_training
from cmemu.v1 import manager_pb2, manager_pb2_grpc, training_pb2_grpc

SERVICE = "cmemu.v1.ClusterManager"
TRAINING_TOPIC = "training"  # the training jobs' events: cmemu/<supernode>/training/events
MODES: dict[Mode, manager_pb2.ManagerMode.ValueType] = {
    Mode.ACTIVE: manager_pb2.MANAGER_MODE_ACTIVE,
    Mode.PASSIVE: manager_pb2.MANAGER_MODE_PASSIVE,
}
MODE_OF = {wire: mode for mode, wire in MODES.items()}


class ManagerService:
    """What the manager's server runs: the engine and the training jobs, started and ended
    together. A kill or a hang of the service suspends the engine only: the training jobs are
    the workload, on their NPUs, not the controller."""

    def __init__(self, engine: ManagerEngine, training: TrainingEngine) -> None:
        self.engine = engine
        self.training = training
        # what runtime/servicecontrol.py sets on service-down: the training jobs' API, as the
        # day plans of this process reach it (engines/training/local.py), is the server's
        self.outage = training.outage
        self._ended = asyncio.Event()
        self._running = False

    async def run(self) -> None:
        self._running = True
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.training.run(), name="training")
                tasks.create_task(self.engine.run(), name="manager")
        finally:
            self._ended.set()

    async def close(self) -> None:
        """Both end before it returns (before the launcher closes the channels they use)."""
        await self.engine.close()
        await self.training.close()
        if self._running:
            await self._ended.wait()

    async def suspend(self) -> None:
        await self.engine.suspend()

    def resume(self) -> None:
        self.engine.resume()

    def partition(self, severed: bool) -> None:
        self.engine.partition(severed)

    def metrics(self) -> Iterable[Family]:
        return self.engine.metrics()


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


def status_message(s: ManagerStatus) -> manager_pb2.ManagerStatus:
    return manager_pb2.ManagerStatus(
        mode=MODES[s.mode],
        devices_watched=s.devices_watched,
        devices_suspect=s.devices_suspect,
        devices_failed=s.devices_failed,
        heartbeat_interval_s=s.heartbeat_interval_s,
        misses_to_fail=s.misses_to_fail,
        open_incidents=s.open_incidents,
        liveness_streams=s.liveness_streams,
        devices_covered=s.devices_covered,
    )


class ManagerServicer(manager_pb2_grpc.ClusterManagerServicer):
    def __init__(self, engine: ManagerEngine) -> None:
        self.engine = engine

    @rpc
    async def GetStatus(
        self, request: manager_pb2.GetManagerStatusRequest, context: Context
    ) -> manager_pb2.ManagerStatus:
        return status_message(self.engine.status())

    @rpc
    async def ListIncidents(
        self, request: manager_pb2.ListIncidentsRequest, context: Context
    ) -> manager_pb2.ListIncidentsResponse:
        return manager_pb2.ListIncidentsResponse(
            incidents=[incident_message(i) for i in self.engine.detector.since(request.since_ns)]
        )

    @rpc
    async def SetMode(
        self, request: manager_pb2.SetModeRequest, context: Context
    ) -> manager_pb2.ManagerStatus:
        mode = MODE_OF.get(request.mode)
        if mode is None:
            raise InvalidArgumentError(
                "mode must be MANAGER_MODE_ACTIVE or MANAGER_MODE_PASSIVE", field="mode"
            )
        self.engine.mode = mode
        self.engine.publish("mode", mode=manager_pb2.ManagerMode.Name(request.mode))
        return status_message(self.engine.status())


def create_manager(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None,
) -> tuple[ManagerService, ServiceHost]:
    training = create_training(
        topology=topology,
        profile=profile,
        clock=clock,
        peers=peers,
        events=events,
        topic=TRAINING_TOPIC,
    )
    peers.host_training(training)
    engine = ManagerEngine(
        topology=topology, profile=profile, clock=clock, peers=peers, events=events, address=address
    )
    servicer = ManagerServicer(engine)
    training_servicer = TrainingServicer(training)
    host = ServiceHost(
        name=engine.name,
        address=address,
        services=[
            (SERVICE, lambda s: manager_pb2_grpc.add_ClusterManagerServicer_to_server(servicer, s)),
            (
                TRAINING_SERVICE,
                lambda s: training_pb2_grpc.add_TrainingServicer_to_server(training_servicer, s),
            ),
        ],
    )
    return ManagerService(engine, training), host
