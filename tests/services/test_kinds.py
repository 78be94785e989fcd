"""The kind-specific services: NPU kernels, CPU NUMA, memory pool, over real gRPC."""

from __future__ import annotations

import grpc
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.testing import Clients
from cmemu.v1 import cpu_pb2, device_pb2, mempool_pb2, npu_pb2

NPU = DEFAULT_PROFILE.npu


async def test_kernel_duration_is_the_roofline_and_kernels_queue_per_die(clients: Clients) -> None:
    npu = clients.npu("n01-npu5")
    # long enough (2 s emulated) that the second kernel surely arrives while the first runs,
    # however loaded the machine: replies come at once, stamped with the emulated times
    flops = NPU.peak_ops_per_s_per_die["BF16"] * 2.0
    first = await npu.SubmitKernel(
        npu_pb2.Kernel(name="gemm", die=0, flops=flops, precision=npu_pb2.PRECISION_BF16)
    )
    assert (first.duration_ns, first.bound) == (2_000_000_000, "compute")
    assert first.complete_ns == first.start_ns + first.duration_ns
    second = await npu.SubmitKernel(
        npu_pb2.Kernel(
            name="attn",
            die=0,
            flops=1.0,
            bytes_moved=int(NPU.hbm_bytes_per_s_per_die * 1.0),
            precision=npu_pb2.PRECISION_INT8,
        )
    )
    assert second.bound == "memory" and second.duration_ns == 1_000_000_000
    assert second.start_ns == first.complete_ns  # die 0 was busy until then
    other_die = await npu.SubmitKernel(
        npu_pb2.Kernel(name="idle die", die=1, flops=1.0, precision=npu_pb2.PRECISION_FP16)
    )
    assert other_die.start_ns == other_die.issue_ns  # die 1 was free
    telemetry = await clients.device("n01-npu5").GetTelemetry(device_pb2.GetTelemetryRequest())
    assert telemetry.utilization > 0


@pytest.mark.parametrize(
    ("kernel", "code", "words"),
    [
        (npu_pb2.Kernel(flops=1.0, precision=npu_pb2.PRECISION_FP8), "INVALID_ARGUMENT", "FP8"),
        (npu_pb2.Kernel(flops=1.0), "INVALID_ARGUMENT", "precision"),
        (
            npu_pb2.Kernel(die=2, flops=1.0, precision=npu_pb2.PRECISION_BF16),
            "OUT_OF_RANGE",
            "die 2",
        ),
        (npu_pb2.Kernel(flops=-5.0, precision=npu_pb2.PRECISION_BF16), "INVALID_ARGUMENT", ">= 0"),
        (
            npu_pb2.Kernel(flops=float("inf"), precision=npu_pb2.PRECISION_BF16),
            "INVALID_ARGUMENT",
            "finite",
        ),
    ],
)
async def test_bad_kernels(clients: Clients, kernel: npu_pb2.Kernel, code: str, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.npu("n00-npu0").SubmitKernel(kernel)
    assert err.value.code().name == code
    assert words in (err.value.details() or "")
    assert await clients.health("n00-npu0", "cmemu.v1.Npu") == "SERVING"


async def test_cpu_numa_is_a_full_mesh_of_the_node(clients: Clients) -> None:
    numa = await clients.cpu("n01-cpu2").GetNuma(cpu_pb2.GetNumaRequest())
    assert numa.node == "n01"
    distances = {p.cpu: p.distance for p in numa.peers}
    assert distances == {"n01-cpu0": 20, "n01-cpu1": 20, "n01-cpu2": 10, "n01-cpu3": 20}


async def test_memory_pool_reports_its_members_and_use(clients: Clients) -> None:
    before = await clients.mempool("n00-mem").GetPool(mempool_pb2.GetPoolRequest())
    assert len(before.members) == 4
    assert before.capacity_bytes == sum(m.contributed_bytes for m in before.members)
    await clients.device("n00-mem").AllocateRegion(device_pb2.AllocateRegionRequest(size=1 << 30))
    after = await clients.mempool("n00-mem").GetPool(mempool_pb2.GetPoolRequest())
    assert after.used_bytes == before.used_bytes + (1 << 30)
    assert after.free_bytes == after.capacity_bytes - after.used_bytes
