"""How one process reaches the devices and services of its topology.

It is the engines' Directory (emulator/engines/peers.py): a device or the fabric hosted in this
process is its engine, called directly (`LocalDevice`, `LocalFabric`: no serialising, one gRPC
call for a UB transaction: the client's); any other is the typed gRPC client
(emulator/client/remote.py) over one shared channel per address. Both raise the same errors.
It is a gateway's GatewayDirectory too: a gateway of the RDMA plane hosted here is its engine
(`LocalGateway`), any other the typed gRPC client (emulator/client/gateway.py).
It is the cluster manager's ControlPlane too: the scheduler directly where this process hosts
its engine (`LocalScheduler`, engines/scheduler/local.py), else over gRPC (emulator/client/
control.py); the router the same way (`LocalRouter`, engines/serving/local.py); the training jobs
directly where this process hosts them (the manager's); a server's health over gRPC.
And it is what the serving and training engines reach the scheduler and EMS through
(`job_scheduler`, `kv_store`): the engine hosted here (`LocalScheduler`, `LocalEms`: the
runtime's waves make the scheduler and EMS before the router and the manager), else the typed
client over the shared channel.

And it is what the scheduler's day plans reach the router and the training jobs through
(`day_serving`, `day_training`: engines/dayplan.py's DayServing and DayTraining): the router's
serving engine and the training engine where this process hosts them (`LocalDayServing`,
engines/serving/local.py; `LocalDayTraining`, engines/training/local.py: through the router's and
the manager's outage), else the typed gRPC clients (emulator/client/dayplan.py). The scheduler is
made before the router and the manager (the runtime's waves), so which one is resolved at each
call (services/daypeers.py), never when the scheduler is made.

`channel` is the older way of the services not yet moved to the engines layer (their own stubs
over the shared channel); it goes as those services move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from cmemu.emulator.client import health
from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.client.remote import ClockStream, RemoteDevice, RemoteFabric
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.engines.peers import (
    DevicePeer,
    FabricPeer,
    GatewayPeer,
    LocalDevice,
    LocalFabric,
    RouterPeer,
    SchedulerPeer,
    TrainingPeer,
)
from cmemu.emulator.model.topology import Device, Service, ServiceKind, Topology

if TYPE_CHECKING:  # hosted in the fabric's process only (numpy): not every process imports it
    from cmemu.emulator.client.control import RemoteRouter, RemoteScheduler
    from cmemu.emulator.engines.dayplan import DayServing, DayTraining
    from cmemu.emulator.engines.ems import EmsState
    from cmemu.emulator.engines.ems.local import LocalEms
    from cmemu.emulator.engines.fabric.engine import FabricEngine
    from cmemu.emulator.engines.gateway.engine import GatewayEngine
    from cmemu.emulator.engines.peers import JobScheduler
    from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
    from cmemu.emulator.engines.scheduler.local import LocalScheduler
    from cmemu.emulator.engines.serving.engine import ServingEngine
    from cmemu.emulator.engines.serving.local import LocalRouter
    from cmemu.emulator.engines.serving.peers import KvStore
    from cmemu.emulator.engines.training.engine import TrainingEngine


class Peers:
    def __init__(self, topology: Topology, credentials: Credentials = ANONYMOUS) -> None:
        self.topology = topology
        self._channels = Channels(credentials)  # every device's calls carry the token
        self._clock_channels = Channels(credentials)
        self._local: dict[str, LocalDevice] = {}
        self._remote: dict[str, RemoteDevice] = {}
        self._local_fabric: LocalFabric | None = None
        self._remote_fabric: RemoteFabric | None = None
        self._gateways: dict[str, GatewayPeer] = {}  # gateway id -> its engine, or a client
        self._training: TrainingPeer | None = None
        self._scheduler: RemoteScheduler | None = None
        self._local_scheduler: LocalScheduler | None = None
        self._local_ems: LocalEms | None = None
        self._router: RemoteRouter | LocalRouter | None = None
        self._day_serving: DayServing | None = None  # the router's engine, or its client
        self._day_training: DayTraining | None = None  # the training engine, or its client

    # --- the engines' Directory ----------------------------------------------------------------

    def host_device(self, engine: DeviceEngine) -> None:
        """A device engine of this process: called directly, never over gRPC."""
        self._local[engine.device.address] = LocalDevice(engine)

    def host_fabric(self, engine: FabricEngine) -> None:
        self._local_fabric = LocalFabric(engine)

    def device(self, device: Device) -> DevicePeer:
        local = self._local.get(device.address)
        if local is not None:
            return local
        remote = self._remote.get(device.address)
        if remote is None:
            remote = self._remote[device.address] = RemoteDevice(
                self.channel(device.address), device
            )
        return remote

    async def forget(self, device: Device) -> None:
        if device.address in self._local:
            return
        self._remote.pop(device.address, None)
        await self._channels.reset(device.address)

    def fabric(self) -> FabricPeer:
        if self._local_fabric is not None:
            return self._local_fabric
        if self._remote_fabric is None:
            address = self.topology.service(ServiceKind.FABRIC).address
            self._remote_fabric = RemoteFabric(self.channel(address))
        return self._remote_fabric

    # --- the gateways' GatewayDirectory ---------------------------------------------------------

    def host_gateway(self, engine: GatewayEngine) -> None:
        """A gateway engine of this process: called directly by whoever asks it here."""
        from cmemu.emulator.engines.gateway.local import LocalGateway  # a gateway's process only

        self._gateways[engine.name] = LocalGateway(engine)

    def gateway(self, gateway: Service) -> GatewayPeer:
        known = self._gateways.get(gateway.id)
        if known is None:
            from cmemu.emulator.client.gateway import (
                RemoteGateway,  # numpy: gateways' processes only
            )

            known = self._gateways[gateway.id] = RemoteGateway(
                self.channel(gateway.address), gateway.id
            )
        return known

    # --- the cluster manager's ControlPlane -----------------------------------------------------

    def host_training(self, training: TrainingEngine) -> None:
        """The training jobs of this process (the manager's server hosts them): called
        directly by the manager engine and the scheduler's day plans, never over gRPC."""
        from cmemu.emulator.engines.training.local import LocalDayTraining

        self._training = training
        self._day_training = LocalDayTraining(training)

    def scheduler(self) -> SchedulerPeer:
        if self._local_scheduler is not None:
            return self._local_scheduler
        if self._scheduler is None:
            # the control plane's clients (their stubs, the scheduler's model): imported by
            # the processes that call it, not by every device's (issue 18: a device's PSS)
            from cmemu.emulator.client.control import RemoteScheduler

            self._scheduler = RemoteScheduler(self.channel(self._address(ServiceKind.SCHEDULER)))
        return self._scheduler

    def host_router(self, engine: ServingEngine) -> None:
        """The router's serving engine of this process: called directly, never over gRPC."""
        from cmemu.emulator.engines.serving.local import LocalDayServing, LocalRouter

        self._router = LocalRouter(engine)
        self._day_serving = LocalDayServing(engine)

    def router(self) -> RouterPeer:
        if self._router is None:
            from cmemu.emulator.client.control import RemoteRouter

            self._router = RemoteRouter(self.channel(self._address(ServiceKind.ROUTER)))
        return self._router

    def training(self) -> TrainingPeer:
        if self._training is not None:
            return self._training
        from cmemu.emulator.client.control import RemoteTraining

        return RemoteTraining(self.channel(self._address(ServiceKind.MANAGER)))

    # --- the router and the training jobs, as the scheduler's day plans reach them ------------

    def day_serving(self) -> DayServing:
        """The router as a day plan moves a deployment, resolved at each call."""
        from cmemu.services.daypeers import DayServingOf

        return DayServingOf(self.day_serving_now)

    def day_training(self) -> DayTraining:
        """The training jobs as a day plan starts and stops its job, resolved at each call."""
        from cmemu.services.daypeers import DayTrainingOf

        return DayTrainingOf(self.day_training_now)

    def day_serving_now(self) -> DayServing:
        """The router's engine if this process hosts it by now, else its gRPC client."""
        if self._day_serving is None:
            from cmemu.emulator.client.dayplan import RemoteDayServing

            self._day_serving = RemoteDayServing(self.channel(self._address(ServiceKind.ROUTER)))
        return self._day_serving

    def day_training_now(self) -> DayTraining:
        """The training engine if this process hosts it by now, else the gRPC client of the
        manager's server (which hosts the jobs)."""
        if self._day_training is None:
            from cmemu.emulator.client.dayplan import RemoteDayTraining

            address = self._address(ServiceKind.MANAGER)
            self._day_training = RemoteDayTraining(self.channel(address))
        return self._day_training

    # --- the scheduler and EMS, as the serving and training engines reach them ------------------

    def host_scheduler(self, engine: SchedulerEngine) -> None:
        """The scheduler's engine of this process: called directly, never over gRPC."""
        from cmemu.emulator.engines.scheduler.local import LocalScheduler

        self._local_scheduler = LocalScheduler(engine)

    def host_ems(self, store: EmsState) -> None:
        """EMS's engine of this process: called directly, never over gRPC."""
        from cmemu.emulator.engines.ems.local import LocalEms

        self._local_ems = LocalEms(store)

    def job_scheduler(self) -> JobScheduler:
        """The scheduler as a deployment or a training job holds NPUs with it."""
        if self._local_scheduler is not None:
            return self._local_scheduler
        from cmemu.emulator.client.scheduler import SchedulerClient

        return SchedulerClient(self.channel(self._address(ServiceKind.SCHEDULER)))

    def kv_store(self) -> KvStore:
        """EMS as a deployment keeps weights and KV blocks, or a training job checkpoints."""
        if self._local_ems is not None:
            return self._local_ems
        from cmemu.emulator.client.ems import EmsClient

        return EmsClient(self.channel(self._address(ServiceKind.EMS)))

    async def serving(self, address: str, *, deadline_s: float) -> bool:
        return await health.serving(self.channel(address), deadline_s)

    def _address(self, kind: ServiceKind) -> str:
        return self.topology.service(kind).address

    def clock_source(self, topology: Topology | None = None) -> ClockStream:
        """Where this process follows emulated time from: sn0's fabric (the first document's,
        or `topology`'s), on channels of the clock's own (ClockStream says why)."""
        address = (topology or self.topology).service(ServiceKind.FABRIC).address
        return ClockStream(self._clock_channels, address)

    # --- the older way: a channel to an address ------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    async def close(self) -> None:
        await self._channels.close()
        await self._clock_channels.close()
