"""The memory pool: the pooled share of a node's CPU DRAM, addressable over UB at its own EID."""

from __future__ import annotations

from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.model.topology import DeviceKind
from cmemu.services.host import Register
from cmemu.services.kindspec import KindSpec
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import device_pb2, mempool_pb2, mempool_pb2_grpc

SERVICE = "cmemu.v1.MemoryPool"


def _members(engine: DeviceEngine) -> list[str]:
    return [d.id for d in engine.topology.in_node(engine.device.node) if d.kind is DeviceKind.CPU]


class MemoryPoolServicer(mempool_pb2_grpc.MemoryPoolServicer):
    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine

    @rpc
    async def GetPool(
        self, request: mempool_pb2.GetPoolRequest, context: Context
    ) -> mempool_pb2.PoolInfo:
        s = self.engine
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


def _hardware(engine: DeviceEngine, info: device_pb2.DeviceInfo) -> None:
    info.mempool.CopyFrom(
        device_pb2.MempoolHardware(
            capacity_bytes=engine.memory.capacity, member_cpus=_members(engine)
        )
    )


def _services(engine: DeviceEngine) -> list[tuple[str, Register]]:
    servicer = MemoryPoolServicer(engine)
    return [
        (
            SERVICE,
            lambda server: mempool_pb2_grpc.add_MemoryPoolServicer_to_server(servicer, server),
        )
    ]


KIND = KindSpec(hardware=_hardware, services=_services)
