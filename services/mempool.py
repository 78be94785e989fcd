"""The memory pool: the pooled share of a node's CPU DRAM, addressable over UB at its own EID."""

from __future__ import annotations

from cmemu.v1 import device_pb2, mempool_pb2, mempool_pb2_grpc
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import DeviceKind
from services.device import DeviceState, KindSpec, no_engines
from services.host import Register
from services.status import Context, rpc

SERVICE = "cmemu.v1.MemoryPool"


def _members(state: DeviceState) -> list[str]:
    return [d.id for d in state.topology.in_node(state.device.node) if d.kind is DeviceKind.CPU]


class MemoryPoolServicer(mempool_pb2_grpc.MemoryPoolServicer):
    def __init__(self, state: DeviceState) -> None:
        self.state = state

    @rpc
    async def GetPool(
        self, request: mempool_pb2.GetPoolRequest, context: Context
    ) -> mempool_pb2.PoolInfo:
        s = self.state
        alloc = s.memory.allocator
        return mempool_pb2.PoolInfo(
            node=s.device.node,
            capacity_bytes=alloc.capacity,
            used_bytes=alloc.used,
            free_bytes=alloc.free,
            members=[
                mempool_pb2.PoolMember(cpu=cpu, contributed_bytes=s.profile.cpu.pooled_bytes)
                for cpu in _members(s)
            ],
        )


def _hardware(state: DeviceState, info: device_pb2.DeviceInfo) -> None:
    info.mempool.CopyFrom(
        device_pb2.MempoolHardware(
            capacity_bytes=state.memory.capacity, member_cpus=_members(state)
        )
    )


def _services(state: DeviceState) -> list[tuple[str, Register]]:
    servicer = MemoryPoolServicer(state)
    return [
        (
            SERVICE,
            lambda server: mempool_pb2_grpc.add_MemoryPoolServicer_to_server(servicer, server),
        )
    ]


def _memory(profile: HardwareProfile) -> int:
    return profile.pool_bytes


KIND = KindSpec(memory_bytes=_memory, engines=no_engines, hardware=_hardware, services=_services)
