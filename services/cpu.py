"""The CPU: a Kunpeng socket whose DRAM is mostly pooled; the rest stays at its own EID."""

from __future__ import annotations

from cmemu.v1 import cpu_pb2, cpu_pb2_grpc, device_pb2
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import DeviceKind
from services.device import DeviceState, KindSpec, no_engines
from services.host import Register
from services.status import Context, rpc

SERVICE = "cmemu.v1.Cpu"


class CpuServicer(cpu_pb2_grpc.CpuServicer):
    def __init__(self, state: DeviceState) -> None:
        self.state = state

    @rpc
    async def GetNuma(self, request: cpu_pb2.GetNumaRequest, context: Context) -> cpu_pb2.NumaInfo:
        s = self.state
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


def _hardware(state: DeviceState, info: device_pb2.DeviceInfo) -> None:
    cpu = state.profile.cpu
    info.cpu.CopyFrom(
        device_pb2.CpuHardware(
            cores=cpu.cores,
            dram_bytes=cpu.dram_bytes,
            local_dram_bytes=cpu.local_bytes,
            pooled_dram_bytes=cpu.pooled_bytes,
            ub_gb_s=cpu.ub_bytes_per_s / 1e9,
        )
    )


def _services(state: DeviceState) -> list[tuple[str, Register]]:
    servicer = CpuServicer(state)
    return [(SERVICE, lambda server: cpu_pb2_grpc.add_CpuServicer_to_server(servicer, server))]


def _memory(profile: HardwareProfile) -> int:
    return profile.cpu.local_bytes


KIND = KindSpec(memory_bytes=_memory, engines=no_engines, hardware=_hardware, services=_services)
