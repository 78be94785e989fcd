"""Typed async stubs for the devices and services of a running emulator, found by topology.

LAZY_STUBS: the stubs of the supernode-wide services no device calls (gateway, router,
scheduler, manager, training) are imported by the method that makes one, so that a device
process (`cmemu serve --device`, which imports this module) does not hold their descriptors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from cmemu.emulator.client import health
from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.model.errors import NotFoundError, quote
from cmemu.emulator.model.scaleout import supernode_of
from cmemu.emulator.model.topology import Device, ServiceKind, Topology
from cmemu.v1 import (
    cpu_pb2_grpc,
    device_pb2_grpc,
    fabric_pb2_grpc,
    mempool_pb2_grpc,
    npu_pb2_grpc,
    ub_pb2_grpc,
)

if TYPE_CHECKING:
    from cmemu.v1 import (
        gateway_pb2_grpc,
        manager_pb2_grpc,
        router_pb2_grpc,
        scheduler_pb2_grpc,
        training_pb2_grpc,
    )


class Clients:
    """Typed async stubs for any device of a topology, over one shared channel per device.

    With several supernodes (`supernodes`: every document of the launch), a device of any of
    them is found by its id, and the supernode-wide services are those of `topology`;
    `supernode(i)` gives the clients of supernode i over the same channels."""

    def __init__(
        self,
        topology: Topology,
        credentials: Credentials = ANONYMOUS,
        *,
        supernodes: tuple[Topology, ...] = (),
        channels: Channels | None = None,
    ) -> None:
        self.topology = topology
        self.supernodes = supernodes or (topology,)
        self.credentials = credentials
        self._owner = channels is None  # closes the channels; a supernode(i) view does not
        self._channels = channels or Channels(credentials)

    def supernode(self, index: int) -> Clients:
        """The clients of supernode `index` of the launch (its fabric, EMS, ... by default)."""
        if not 0 <= index < len(self.supernodes):
            raise NotFoundError(f"no supernode sn{index}: {len(self.supernodes)} in this launch")
        return Clients(
            self.supernodes[index],
            self.credentials,
            supernodes=self.supernodes,
            channels=self._channels,
        )

    def find(self, device_id: str) -> Device:
        """A device of any supernode of the launch."""
        if len(self.supernodes) == 1:
            return self.topology.device(device_id)
        return supernode_of(device_id, self.supernodes).device(device_id)

    def channel_to(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def channel(self, device_id: str) -> grpc.aio.Channel:
        return self._channels.get(self.find(device_id).address)

    def device(self, device_id: str) -> device_pb2_grpc.DeviceAsyncStub:
        return device_pb2_grpc.DeviceStub(self.channel(device_id))

    def bus(self, device_id: str) -> ub_pb2_grpc.UnifiedBusAsyncStub:
        return ub_pb2_grpc.UnifiedBusStub(self.channel(device_id))

    def npu(self, device_id: str) -> npu_pb2_grpc.NpuAsyncStub:
        return npu_pb2_grpc.NpuStub(self.channel(device_id))

    def cpu(self, device_id: str) -> cpu_pb2_grpc.CpuAsyncStub:
        return cpu_pb2_grpc.CpuStub(self.channel(device_id))

    def fabric(self) -> fabric_pb2_grpc.FabricAsyncStub:
        return fabric_pb2_grpc.FabricStub(
            self.channel_to(self.topology.service(ServiceKind.FABRIC).address)
        )

    def gateway(self, which: int | str | None = None) -> gateway_pb2_grpc.GatewayAsyncStub:
        """The RDMA gateway of a supernode, by index (1) or id ("sn1-gw"); None: this
        document's own supernode's. NotFoundError without a scale-out plane."""
        from cmemu.v1 import gateway_pb2_grpc  # (see the module's LAZY_STUBS)

        return gateway_pb2_grpc.GatewayStub(self.channel_to(self.gateway_address(which)))

    def gateway_address(self, which: int | str | None = None) -> str:
        plane = self.topology.scaleout
        if plane is None:
            raise NotFoundError(
                f"preset {self.topology.preset} has no RDMA scale-out plane, so no gateway "
                "(use a <base>xN preset, e.g. cm-minix1)",
                reason="NO_SCALEOUT_PLANE",
            )
        if which is None:
            return plane.gateway(self.topology.index).address
        if isinstance(which, int):
            return plane.gateway(which).address
        for gateway in plane.gateways:
            if gateway.id == which:
                return gateway.address
        raise NotFoundError(
            f"no gateway {quote(which)}; gateways: {', '.join(g.id for g in plane.gateways)}",
            subject=which,
            reason="GATEWAY_NOT_FOUND",
        )

    def router(self) -> router_pb2_grpc.RouterAsyncStub:
        from cmemu.v1 import router_pb2_grpc  # (see the module's LAZY_STUBS)

        return router_pb2_grpc.RouterStub(
            self.channel_to(self.topology.service(ServiceKind.ROUTER).address)
        )

    def scheduler(self) -> scheduler_pb2_grpc.SchedulerAsyncStub:
        from cmemu.v1 import scheduler_pb2_grpc  # (see the module's LAZY_STUBS)

        return scheduler_pb2_grpc.SchedulerStub(
            self.channel_to(self.topology.service(ServiceKind.SCHEDULER).address)
        )

    def manager(self) -> manager_pb2_grpc.ClusterManagerAsyncStub:
        from cmemu.v1 import manager_pb2_grpc  # (see the module's LAZY_STUBS)

        return manager_pb2_grpc.ClusterManagerStub(
            self.channel_to(self.topology.service(ServiceKind.MANAGER).address)
        )

    def training(self) -> training_pb2_grpc.TrainingAsyncStub:
        """Training jobs are hosted on the manager's server."""
        from cmemu.v1 import training_pb2_grpc  # (see the module's LAZY_STUBS)

        return training_pb2_grpc.TrainingStub(
            self.channel_to(self.topology.service(ServiceKind.MANAGER).address)
        )

    def mempool(self, device_id: str) -> mempool_pb2_grpc.MemoryPoolAsyncStub:
        return mempool_pb2_grpc.MemoryPoolStub(self.channel(device_id))

    async def health(self, device_id: str, service: str = "", timeout_s: float = 2.0) -> str:
        """SERVING, NOT_SERVING, or for a device that does not answer UNREACHABLE (crashed,
        stopped) or DEADLINE_EXCEEDED (hung): what the check found, not an exception."""
        return await health.status(self.channel(device_id), service, timeout_s)

    async def close(self) -> None:
        if self._owner:
            await self._channels.close()
