"""The table of device kinds, and the one function that turns a topology entry into a server."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.v1 import device_pb2_grpc, ub_pb2_grpc
from emulator.model.clock import Clock
from emulator.model.hardware import HardwareProfile
from emulator.model.memory import DeviceMemory
from emulator.model.topology import Device, DeviceKind, Topology
from services import cpu, mempool, npu
from services.device import DeviceServicer, DeviceState, Engine, KindSpec
from services.eventsink import EventSink
from services.host import ServiceHost
from services.peers import Peers
from services.ub import UnifiedBusServicer

KINDS: dict[DeviceKind, KindSpec] = {
    DeviceKind.NPU: npu.KIND,
    DeviceKind.CPU: cpu.KIND,
    DeviceKind.MEMPOOL: mempool.KIND,
}

DEVICE_SERVICE = "cmemu.v1.Device"
UB_SERVICE = "cmemu.v1.UnifiedBus"


@dataclass(frozen=True)
class DeviceHandle:
    state: DeviceState
    host: ServiceHost

    async def start(self) -> None:
        await self.host.start()
        await self.host.set_serving(not self.state.fault.faulted)


def create_device(
    device: Device,
    *,
    topology: Topology,
    profile: HardwareProfile,
    clock: Clock,
    peers: Peers,
    events: EventSink | None = None,
) -> DeviceHandle:
    kind = KINDS[device.kind]
    limits = profile.limits
    store_budget, queue_budget = peers.budgets(limits)
    state = DeviceState(
        device=device,
        topology=topology,
        profile=profile,
        clock=clock,
        peers=peers,
        memory=DeviceMemory(
            capacity=kind.memory_bytes(profile),
            alignment=limits.region_alignment,
            page_bytes=limits.store_page_bytes,
            cap_bytes=limits.stored_bytes_cap_per_device,
            budget=store_budget,
            max_regions=limits.regions_max_per_device,
        ),
        queue_budget=queue_budget,
        engines=[Engine() for _ in range(kind.engines(profile))],
        events=events,
    )
    device_servicer = DeviceServicer(state, kind.hardware)
    bus_servicer = UnifiedBusServicer(state)
    host = ServiceHost(
        name=device.id,
        address=device.address,
        services=[
            (
                DEVICE_SERVICE,
                lambda s: device_pb2_grpc.add_DeviceServicer_to_server(device_servicer, s),
            ),
            (UB_SERVICE, lambda s: ub_pb2_grpc.add_UnifiedBusServicer_to_server(bus_servicer, s)),
            *kind.services(state),
        ],
    )
    state.on_health = host.set_serving
    peers.register_bus(device.address, bus_servicer)
    peers.register_device(device.address, device_servicer)
    return DeviceHandle(state, host)
