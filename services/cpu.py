"""The CPU: a Kunpeng socket whose DRAM is mostly pooled; the rest stays at its own EID."""

from __future__ import annotations

from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.model.topology import DeviceKind
from cmemu.services.host import Register
from cmemu.services.kindspec import KindSpec
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import cpu_pb2, cpu_pb2_grpc, device_pb2

SERVICE = "cmemu.v1.Cpu"


class CpuServicer(cpu_pb2_grpc.CpuServicer):
    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine

    @rpc
    async def GetNuma(self, request: cpu_pb2.GetNumaRequest, context: Context) -> cpu_pb2.NumaInfo:
        s = self.engine
        cpu = s.profile.cpu
        peers = [d for d in s.topology.in_node(s.device.node) if d.kind is DeviceKind.CPU]
        return cpu_pb2.NumaInfo(
            node=s.device.node,
            peers=[
                cpu_pb2.NumaPeer(
                    cpu=p.id,
                    distance=cpu.numa_local_distance if p is s.device else cpu.numa_remote_distance,
                )
                for p in peers
            ],
        )


def _hardware(engine: DeviceEngine, info: device_pb2.DeviceInfo) -> None:
    cpu = engine.profile.cpu
    info.cpu.CopyFrom(
        device_pb2.CpuHardware(
            cores=cpu.cores,
            dram_bytes=cpu.dram_bytes,
            local_dram_bytes=cpu.local_bytes,
            pooled_dram_bytes=cpu.pooled_bytes,
            ub_gb_s=cpu.ub_bytes_per_s / 1e9,
        )
    )


def _services(engine: DeviceEngine) -> list[tuple[str, Register]]:
    servicer = CpuServicer(engine)
    return [(SERVICE, lambda server: cpu_pb2_grpc.add_CpuServicer_to_server(servicer, server))]


KIND = KindSpec(hardware=_hardware, services=_services)
