"""Typed async stubs for the devices and services of a running emulator, found by topology."""

from __future__ import annotations

import grpc

from cmemu.v1 import (
    cpu_pb2_grpc,
    device_pb2_grpc,
    fabric_pb2_grpc,
    manager_pb2_grpc,
    mempool_pb2_grpc,
    npu_pb2_grpc,
    router_pb2_grpc,
    scheduler_pb2_grpc,
    training_pb2_grpc,
    ub_pb2_grpc,
)
from emulator.client import health
from emulator.client.channels import Channels
from emulator.client.credentials import ANONYMOUS, Credentials
from emulator.model.topology import ServiceKind, Topology


class Clients:
    """Typed async stubs for any device of a topology, over one shared channel per device."""

    def __init__(self, topology: Topology, credentials: Credentials = ANONYMOUS) -> None:
        self.topology = topology
        self.credentials = credentials
        self._channels = Channels(credentials)

    def channel_to(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def channel(self, device_id: str) -> grpc.aio.Channel:
        return self._channels.get(self.topology.device(device_id).address)

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

    def router(self) -> router_pb2_grpc.RouterAsyncStub:
        return router_pb2_grpc.RouterStub(
            self.channel_to(self.topology.service(ServiceKind.ROUTER).address)
        )

    def scheduler(self) -> scheduler_pb2_grpc.SchedulerAsyncStub:
        return scheduler_pb2_grpc.SchedulerStub(
            self.channel_to(self.topology.service(ServiceKind.SCHEDULER).address)
        )

    def manager(self) -> manager_pb2_grpc.ClusterManagerAsyncStub:
        return manager_pb2_grpc.ClusterManagerStub(
            self.channel_to(self.topology.service(ServiceKind.MANAGER).address)
        )

    def training(self) -> training_pb2_grpc.TrainingAsyncStub:
        """Training jobs are hosted on the manager's server."""
        return training_pb2_grpc.TrainingStub(
            self.channel_to(self.topology.service(ServiceKind.MANAGER).address)
        )

    def mempool(self, device_id: str) -> mempool_pb2_grpc.MemoryPoolAsyncStub:
        return mempool_pb2_grpc.MemoryPoolStub(self.channel(device_id))

    async def health(self, device_id: str, service: str = "") -> str:
        return await health.check(self.channel(device_id), service)

    async def close(self) -> None:
        await self._channels.close()
