"""The NPU: an Ascend 910C package of two dies, each running kernels in order on its cube cores.

A kernel's duration is its roofline time from the cost model; kernels queue per die in emulated
time, which is what the utilisation in telemetry measures.
"""

from __future__ import annotations

import dataclasses
import math

from cmemu.v1 import device_pb2, npu_pb2, npu_pb2_grpc
from emulator.model.costmodel import kernel_cost
from emulator.model.errors import CapacityError, InvalidArgumentError, OutOfRangeError, blame
from emulator.model.hardware import HardwareProfile
from services.device import DeviceState, KindSpec
from services.host import Register
from services.status import Context, rpc

SERVICE = "cmemu.v1.Npu"


class NpuServicer(npu_pb2_grpc.NpuServicer):
    def __init__(self, state: DeviceState) -> None:
        self.state = state

    @rpc
    async def SubmitKernel(self, request: npu_pb2.Kernel, context: Context) -> npu_pb2.KernelResult:
        s = self.state
        s.require_healthy()
        if request.precision == npu_pb2.PRECISION_UNSPECIFIED:
            raise InvalidArgumentError("precision is required", field="precision")
        if request.precision not in npu_pb2.Precision.values():
            raise InvalidArgumentError(
                f"precision {request.precision} is not one of"
                f" {', '.join(npu_pb2.Precision.keys()[1:])}",
                field="precision",
                reason="UNSUPPORTED_PRECISION",
            )
        if not math.isfinite(request.flops) or request.flops < 0:
            raise InvalidArgumentError(
                f"flops must be finite and >= 0, got {request.flops}", field="flops"
            )
        if request.die >= len(s.engines):
            raise OutOfRangeError(
                f"die {request.die} does not exist; {s.device.id} has {len(s.engines)}",
                field="die",
                subject=s.device.id,
                reason="DIE_NOT_FOUND",
            )
        s.require_die(request.die)
        precision = npu_pb2.Precision.Name(request.precision).removeprefix("PRECISION_")
        with (
            blame(
                field="precision",
                subject=precision,
                reason="UNSUPPORTED_PRECISION",
                on=InvalidArgumentError,
            ),
            blame(subject=s.device.id),
        ):
            cost = kernel_cost(request.flops, request.bytes_moved, precision, s.profile)
        if s.effects.compute_share < 1:  # a slow fault: the same work takes longer
            cost = dataclasses.replace(
                cost, duration_ns=round(cost.duration_ns / s.effects.compute_share)
            )
        engine = s.engines[request.die]
        issue = s.clock.now_ns()
        start = max(issue, engine.busy_until_ns)
        backlog_max_ns = round(s.profile.limits.engine_backlog_max_s * 1e9)
        if start - issue + cost.duration_ns > backlog_max_ns:
            raise CapacityError(
                f"work queued on die {request.die} of {s.device.id}",
                cost.duration_ns,
                max(0, backlog_max_ns - (start - issue)),
                unit="emulated ns",
                field="die",
                subject=s.device.id,
                reason="ENGINE_QUEUE_FULL",
            )
        engine.busy_until_ns = start + cost.duration_ns
        engine.busy_ns += cost.duration_ns
        s.latency.kernel.observe((engine.busy_until_ns - issue) / 1e9)
        return npu_pb2.KernelResult(
            name=request.name,
            die=request.die,
            issue_ns=issue,
            start_ns=start,
            complete_ns=engine.busy_until_ns,
            duration_ns=cost.duration_ns,
            bound=cost.bound,
        )


def _hardware(state: DeviceState, info: device_pb2.DeviceInfo) -> None:
    npu = state.profile.npu
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


def _services(state: DeviceState) -> list[tuple[str, Register]]:
    servicer = NpuServicer(state)
    return [(SERVICE, lambda server: npu_pb2_grpc.add_NpuServicer_to_server(servicer, server))]


def _memory(profile: HardwareProfile) -> int:
    return profile.npu.hbm_bytes


def _engines(profile: HardwareProfile) -> int:
    return profile.npu.dies


KIND = KindSpec(memory_bytes=_memory, engines=_engines, hardware=_hardware, services=_services)
