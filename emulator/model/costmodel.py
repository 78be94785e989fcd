"""The cost model: pure functions giving the emulated duration of an operation.

No I/O and no state: every figure comes from the hardware profile, so that live mode (which paces
replies by these durations) and model mode (which replays them in a discrete-event simulation)
agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model.errors import InvalidArgumentError, OutOfRangeError
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.topology import DeviceKind

NS = 1e9


def check_duration(
    seconds: float, what: str, profile: HardwareProfile = DEFAULT_PROFILE, *, field: str = ""
) -> None:
    """Refuse an operation whose emulated duration exceeds the ceiling (EmulatorLimits.
    operation_max_s): it would pace a reply for years and overflow every int64 timestamp.
    Called before the operation changes any counter or state."""
    ceiling = profile.limits.operation_max_s
    if not seconds <= ceiling:  # NaN too
        raise OutOfRangeError(
            f"{what} would take {seconds:.4g} emulated seconds; the limit is {ceiling:g}",
            field=field or None,
            reason="OPERATION_TOO_LONG",
        )


def ub_base_latency_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Fixed cost of a UB transaction inside a node, fitted so that the calibrated small read
    (512 bytes in 1.2 us at the achieved per-die bandwidth) comes out exactly."""
    ub = profile.ub
    return ub.small_read_s - ub.small_read_bytes / ub.achieved_bytes_per_s_per_die


def hop_latency_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Latency of one switch hop: crossing nodes adds two (an L2 chip and a second L1 chip)."""
    return profile.ub.cross_node_extra_latency_s / 2


def endpoint_latency_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Fixed cost at the two ends of any UB transfer (issue, DMA setup, completion), so that an
    intra-node transfer (one L1 hop) has exactly the calibrated base latency."""
    return ub_base_latency_s(profile) - hop_latency_s(profile)


def ub_efficiency(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Share of raw port bandwidth a transfer achieves (167 of 196 GB/s per die)."""
    npu = profile.npu
    return profile.ub.achieved_bytes_per_s_per_die / (
        npu.ub_ports_per_die * npu.ub_port_bytes_per_s
    )


def endpoint_bytes_per_s(kind: DeviceKind, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Achieved UB bandwidth at one end of a transfer: an NPU die, a CPU socket, or a memory pool
    (striped over the node's CPUs)."""
    achieved = {
        DeviceKind.NPU: profile.ub.achieved_bytes_per_s_per_die,
        DeviceKind.CPU: profile.cpu.ub_bytes_per_s * ub_efficiency(profile),
        DeviceKind.MEMPOOL: profile.node.cpus * profile.cpu.ub_bytes_per_s * ub_efficiency(profile),
    }
    return achieved[kind]


def ub_transfer_ns(
    size: int,
    *,
    src: DeviceKind,
    dst: DeviceKind,
    cross_node: bool,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> int:
    """Emulated duration of one uncontended UB transaction of `size` bytes.

    Latency plus serialisation at the slower end; crossing nodes adds the L2 hop's latency and its
    bandwidth loss. The fabric refines this with contention on the real link graph.
    """
    if size < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {size}")
    bandwidth = min(endpoint_bytes_per_s(src, profile), endpoint_bytes_per_s(dst, profile))
    latency = ub_base_latency_s(profile)
    if cross_node:
        latency += profile.ub.cross_node_extra_latency_s
        bandwidth *= 1.0 - profile.ub.cross_node_bandwidth_loss
    return round((latency + size / bandwidth) * NS)


@dataclass(frozen=True)
class KernelCost:
    duration_ns: int
    bound: str  # "compute" or "memory"


def kernel_cost(
    flops: float,
    bytes_moved: int,
    precision: str,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> KernelCost:
    """Roofline time of a kernel on one die: the slower of its compute and its HBM traffic."""
    peaks = profile.npu.peak_ops_per_s_per_die
    if precision not in peaks:
        raise InvalidArgumentError(
            f"precision {precision} is not supported by this NPU; supported: {', '.join(peaks)}"
        )
    if flops < 0 or bytes_moved < 0:
        raise InvalidArgumentError("flops and bytes_moved must be >= 0")
    compute_s = flops / peaks[precision]
    memory_s = bytes_moved / profile.npu.hbm_bytes_per_s_per_die
    check_duration(compute_s, "the kernel's compute", profile, field="flops")
    check_duration(memory_s, "the kernel's HBM traffic", profile, field="bytes_moved")
    bound = "compute" if compute_s >= memory_s else "memory"
    return KernelCost(duration_ns=round(max(compute_s, memory_s) * NS), bound=bound)


MOE_OPS = ("dispatch", "combine")


def moe_bytes_per_token(op: str, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    moe = profile.moe
    return {"dispatch": moe.dispatch_bytes_per_token, "combine": moe.combine_bytes_per_token}[op]


def moe_overhead_s(op: str, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Fixed software cost of a MoE dispatch or combine, fitted to the EP8 calibration point.

    The calibration group is 8 dies on 4 NPUs of one node: each die sends an even share of its
    token copies to every rank; its own share stays local, its sibling die's share crosses the
    die-to-die link in parallel, and the 6 others leave through its UB ports, the bottleneck.
    What the measured time has beyond that transfer is software: quantisation, routing metadata,
    synchronisation.
    """
    moe = profile.moe
    measured = {"dispatch": moe.dispatch_s, "combine": moe.combine_s}[op]
    per_rank = moe.tokens_per_rank * moe.top_k * moe_bytes_per_token(op, profile)
    over_ports = per_rank * (moe.ep_ranks - 2) / moe.ep_ranks
    transfer = ub_base_latency_s(profile) + over_ports / profile.ub.achieved_bytes_per_s_per_die
    return measured - transfer


def ems_ssd_ns(size: int, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """Emulated duration of reading or writing `size` bytes on EMS's SSD tier: its latency plus
    the bytes at one node's SSD bandwidth."""
    if size < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {size}")
    ems = profile.ems
    return round((ems.ssd_latency_s + size / ems.ssd_bytes_per_s_per_node) * NS)
