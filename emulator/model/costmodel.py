"""The cost model: pure functions giving the emulated duration of an operation.

No I/O and no state: every figure comes from the hardware profile, so that live mode (which paces
replies by these durations) and model mode (which replays them in a discrete-event simulation)
agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cmemu.emulator.model.errors import InvalidArgumentError, OutOfRangeError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import DeviceKind

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


class UbOp(StrEnum):
    """A UB transaction as the cost model prices it (the wire's CAS and FETCH_ADD are atomics)."""

    READ = "read"
    WRITE = "write"
    ATOMIC = "atomic"
    SEND = "send"


class TargetMemory(StrEnum):
    """The memory a transaction's target serves it from: its figures are measured apart."""

    HBM = "hbm"  # an NPU die's
    CPU = "cpu"  # CPU DRAM: a CPU's own, or a node's memory pool (the CPUs' pooled DRAM)


TARGET_MEMORY = {
    DeviceKind.NPU: TargetMemory.HBM,
    DeviceKind.CPU: TargetMemory.CPU,
    DeviceKind.MEMPOOL: TargetMemory.CPU,
}

PRICED_AS = {
    UbOp.READ: UbOp.READ,
    UbOp.WRITE: UbOp.WRITE,
    # Not published. An atomic is applied at the target (read, modify, write its word) and
    # completes on the target's acknowledgement, as a write does: it takes the write's latency,
    # the costlier of the two. A SEND's bytes go from the issuer into the target's queue, the
    # way a write's go into its memory: the write's figures too.
    UbOp.ATOMIC: UbOp.WRITE,
    UbOp.SEND: UbOp.WRITE,
}


@dataclass(frozen=True)
class UbPoint:
    """One calibration row: a transfer's achieved bandwidth and its small-transfer time."""

    bytes_per_s: float
    small_s: float


def ub_point(
    op: UbOp = UbOp.READ,
    target: DeviceKind = DeviceKind.NPU,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> UbPoint:
    """The published row (per die, inside one node) that prices `op` against a `target` device.
    Every UB transaction asks for several (its pricing, its target's check): remembered per
    profile, by identity (a profile is frozen; the entry holds it, so its id is never reused)."""
    key = (op, target, id(profile))
    held = _UB_POINTS.get(key)
    if held is not None and held[0] is profile:
        return held[1]
    if len(_UB_POINTS) >= _UB_POINTS_MAX:  # what-if sweeps make many profiles
        _UB_POINTS.clear()
    point = _ub_point(op, target, profile)
    _UB_POINTS[key] = (profile, point)
    return point


_UB_POINTS: dict[tuple[UbOp, DeviceKind, int], tuple[HardwareProfile, UbPoint]] = {}
_UB_POINTS_MAX = 1024


def _ub_point(op: UbOp, target: DeviceKind, profile: HardwareProfile) -> UbPoint:
    ub = profile.ub
    rows = {
        (UbOp.READ, TargetMemory.HBM): UbPoint(ub.achieved_bytes_per_s_per_die, ub.small_read_s),
        (UbOp.WRITE, TargetMemory.HBM): UbPoint(ub.write_bytes_per_s_per_die, ub.small_write_s),
        (UbOp.READ, TargetMemory.CPU): UbPoint(
            ub.cpu_memory_read_bytes_per_s, ub.cpu_memory_small_read_s
        ),
        (UbOp.WRITE, TargetMemory.CPU): UbPoint(
            ub.cpu_memory_write_bytes_per_s, ub.cpu_memory_small_write_s
        ),
    }
    return rows[(PRICED_AS[op], TARGET_MEMORY[target])]


def ub_latency_s(
    op: UbOp = UbOp.READ,
    target: DeviceKind = DeviceKind.NPU,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> float:
    """Fixed cost of a UB transaction inside a node, fitted so that its calibrated small transfer
    (512 bytes in 1.2 us for a read of NPU memory, and so on) comes out exactly."""
    point = ub_point(op, target, profile)
    return point.small_s - profile.ub.small_read_bytes / point.bytes_per_s


def ub_base_latency_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """The reference transaction's fixed cost: an NPU -> NPU read inside a node."""
    return ub_latency_s(UbOp.READ, DeviceKind.NPU, profile)


def ub_wire_cost(
    op: UbOp = UbOp.READ,
    target: DeviceKind = DeviceKind.NPU,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> float:
    """Bytes of link capacity one payload byte occupies, relative to the reference read (1.0).

    One die's transfer is striped over all of its ports and saturates them, so the rows measure
    what the same links carry per op: a write moves 137 GB/s of payload where a read moves 167
    (acknowledgements, ordering), CPU memory answers slower than HBM. The difference is a cost
    per byte on every trunk the transaction crosses, not a ceiling of its own: several writes
    into one die share 137 GB/s of payload, as one does."""
    reference = profile.ub.achieved_bytes_per_s_per_die
    return reference / ub_point(op, target, profile).bytes_per_s


def hop_latency_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Latency of one switch hop: crossing nodes adds two (an L2 chip and a second L1 chip)."""
    return profile.ub.cross_node_extra_latency_s / 2


def endpoint_latency_s(
    profile: HardwareProfile = DEFAULT_PROFILE,
    op: UbOp = UbOp.READ,
    target: DeviceKind = DeviceKind.NPU,
) -> float:
    """Fixed cost at the two ends of a UB transfer (issue, DMA setup, the target's memory,
    completion), so that an intra-node transfer (one L1 hop) has exactly its calibrated latency."""
    return ub_latency_s(op, target, profile) - hop_latency_s(profile)


def ub_efficiency(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Share of raw port bandwidth the reference transfer achieves (167 of the 196 GB/s per die
    it was measured on): the protocol's, so it stays when a what-if changes the ports and the
    links' capacities (port rate x this) follow the ports. Taken against the profile's own ports
    it would cancel them: a quarter of the port rate would give four times the efficiency."""
    return profile.ub.achieved_bytes_per_s_per_die / profile.ub.measured_on_bytes_per_s_per_die


def die_port_bytes_per_s(profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """A die's raw UB bandwidth one way: its ports times their rate (196 GB/s)."""
    return profile.npu.ub_ports_per_die * profile.npu.ub_port_bytes_per_s


def endpoint_bytes_per_s(kind: DeviceKind, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """Reference UB bandwidth at one end of a transfer: an NPU die, a CPU socket, or a memory
    pool (striped over the node's CPUs)."""
    cpu = profile.cpu.ub_bytes_per_s * ub_wire_cost(UbOp.READ, DeviceKind.CPU, profile)
    achieved = {  # in link bytes (ub_wire_cost): a socket's 160 GB/s is of reads of its memory
        DeviceKind.NPU: ub_efficiency(profile) * die_port_bytes_per_s(profile),
        DeviceKind.CPU: cpu,
        DeviceKind.MEMPOOL: profile.node.cpus * cpu,
    }
    return achieved[kind]


def ub_transfer_ns(
    size: int,
    *,
    src: DeviceKind,
    dst: DeviceKind,
    cross_node: bool,
    profile: HardwareProfile = DEFAULT_PROFILE,
    op: UbOp = UbOp.READ,
) -> int:
    """Emulated duration of one uncontended UB transaction of `size` bytes issued by a `src`
    device against a `dst` device.

    The op's latency against the target's memory, plus serialisation at the slower end at the
    op's cost per byte; crossing nodes adds the L2 hop's latency and its bandwidth loss. The
    fabric refines this with contention on the real link graph.
    """
    if size < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {size}")
    latency, bandwidth = _ub_rate(src, dst, cross_node, op, profile)
    return round((latency + size / bandwidth) * NS)


def _ub_rate(
    src: DeviceKind, dst: DeviceKind, cross_node: bool, op: UbOp, profile: HardwareProfile
) -> tuple[float, float]:
    """ub_transfer_ns's size-free part (latency s, bytes/s), remembered per profile by identity
    as ub_point is: every UB transaction's target prices itself twice (the fabric's check, then
    the delivery), and computing it afresh took about 10% of a Submit's server time."""
    key = (src, dst, cross_node, op, id(profile))
    held = _UB_RATES.get(key)
    if held is not None and held[0] is profile:
        return held[1]
    bandwidth = min(endpoint_bytes_per_s(src, profile), endpoint_bytes_per_s(dst, profile))
    bandwidth /= ub_wire_cost(op, dst, profile)
    latency = ub_latency_s(op, dst, profile)
    if cross_node:
        latency += profile.ub.cross_node_extra_latency_s
        bandwidth *= 1.0 - profile.ub.cross_node_bandwidth_loss
    if len(_UB_RATES) >= _UB_POINTS_MAX:
        _UB_RATES.clear()
    _UB_RATES[key] = (profile, (latency, bandwidth))
    return latency, bandwidth


_UB_RATES: dict[
    tuple[DeviceKind, DeviceKind, bool, UbOp, int], tuple[HardwareProfile, tuple[float, float]]
] = {}


@dataclass(frozen=True)
class KernelCost:
    """A kernel's emulated duration, and whether compute or memory bounds it."""

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


def moe_overhead_s(
    op: str, profile: HardwareProfile = DEFAULT_PROFILE, *, ranks: int | None = None
) -> float:
    """Software cost of a MoE dispatch or combine over `ranks` ranks (default: the EP8
    calibration's): a fixed part plus a part per peer, fitted to the EP8 and EP256 points.

    The fixed part is quantisation, routing metadata and the kernel launch; the part per peer is
    what a rank does for each other rank: a message header with its token counts and a completion
    flag to write, and one to wait for. Those are per peer and handled by a fixed set of cores,
    so the cost grows linearly with the peers; a logarithmic term would describe a tree barrier,
    which a fused all-to-all does not use (every rank signals every peer directly).
    """
    moe = profile.moe
    base, per_peer = {
        "dispatch": (moe.dispatch_overhead_base_s, moe.dispatch_overhead_per_peer_s),
        "combine": (moe.combine_overhead_base_s, moe.combine_overhead_per_peer_s),
    }[op]
    peers = (moe.ep_ranks if ranks is None else ranks) - 1
    return base + per_peer * max(peers, 0)


def moe_points(profile: HardwareProfile = DEFAULT_PROFILE) -> list[tuple[str, int, float]]:
    """The published MoE points the overhead is fitted to: (op, ranks, whole-operation seconds)."""
    moe = profile.moe
    return [
        ("dispatch", moe.ep_ranks, moe.dispatch_s),
        ("combine", moe.ep_ranks, moe.combine_s),
        ("dispatch", moe.large_ep_ranks, moe.dispatch_large_s),
        ("combine", moe.large_ep_ranks, moe.combine_large_s),
    ]


def ems_ssd_ns(size: int, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """Emulated duration of reading or writing `size` bytes on EMS's SSD tier: its latency plus
    the bytes at one node's SSD bandwidth."""
    if size < 0:
        raise InvalidArgumentError(f"size must be >= 0, got {size}")
    ems = profile.ems
    return round((ems.ssd_latency_s + size / ems.ssd_bytes_per_s_per_node) * NS)
