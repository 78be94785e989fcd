"""The Npu service: an Ascend 910C's kernels, on its engine's dies (engines/device/npu.py)."""

from __future__ import annotations

from cmemu.emulator.client.wire import device as wire
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.services.host import Register
from cmemu.services.kindspec import KindSpec
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import device_pb2, npu_pb2, npu_pb2_grpc

SERVICE = "cmemu.v1.Npu"


class NpuServicer(npu_pb2_grpc.NpuServicer):
    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine

    @rpc
    async def SubmitKernel(self, request: npu_pb2.Kernel, context: Context) -> npu_pb2.KernelResult:
        self.engine.require_healthy()
        return wire.kernel_result_proto(self.engine.dies.run(wire.kernel(request)))


def _hardware(engine: DeviceEngine, info: device_pb2.DeviceInfo) -> None:
    npu = engine.profile.npu
    info.npu.CopyFrom(
        device_pb2.NpuHardware(
            dies=npu.dies,
            cube_cores_per_die=npu.cube_cores_per_die,
            vector_cores_per_die=npu.vector_cores_per_die,
            hbm_bytes_per_die=npu.hbm_bytes_per_die,
            hbm_gb_s_per_die=npu.hbm_bytes_per_s_per_die / 1e9,
            ub_ports_per_die=npu.ub_ports_per_die,
            ub_port_gb_s=npu.ub_port_bytes_per_s / 1e9,
            die_to_die_gb_s=npu.die_to_die_bytes_per_s / 1e9,
            rdma_gb_s_per_die=npu.rdma_bytes_per_s_per_die / 1e9,
            peak_tflops_per_die={k: v / 1e12 for k, v in npu.peak_ops_per_s_per_die.items()},
        )
    )


def _services(engine: DeviceEngine) -> list[tuple[str, Register]]:
    servicer = NpuServicer(engine)
    return [(SERVICE, lambda server: npu_pb2_grpc.add_NpuServicer_to_server(servicer, server))]


KIND = KindSpec(hardware=_hardware, services=_services)
