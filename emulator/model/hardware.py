"""The hardware profile: every figure the models use, in one place, each with its source.

Sources follow ../shared/HARDWARE.md: ``pub`` (published by the vendor or in its 2025 serving
paper), ``est`` (a public modelling estimate) and ``assumed`` (not published: our default, keep it
configurable). A figure is read from here and nowhere else; a literal in a second place is a bug.

Units are SI base units throughout: bytes, bytes per second, seconds, operations per second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

GB = 1e9
GiB = 2**30


def fig(value: Any, src: str) -> Any:
    """A dataclass field carrying its source, so that the profile can be listed with provenance."""
    if isinstance(value, Mapping):
        frozen = MappingProxyType(dict(value))
        return field(default_factory=lambda: frozen, metadata={"src": src})
    return field(default=value, metadata={"src": src})


@dataclass(frozen=True, kw_only=True)
class NpuProfile:
    """Ascend 910C: two dies in one package; each die is one rank."""

    dies: int = fig(2, "pub")
    cube_cores_per_die: int = fig(24, "pub")
    vector_cores_per_die: int = fig(48, "pub")
    hbm_bytes_per_die: int = fig(64 * GiB, "pub")
    hbm_bytes_per_s_per_die: float = fig(1.6e12, "pub")
    die_to_die_bytes_per_s: float = fig(270 * GB, "pub")
    ub_ports_per_die: int = fig(7, "pub")
    ub_port_bytes_per_s: float = fig(28 * GB, "pub")
    rdma_bytes_per_s_per_die: float = fig(200e9 / 8, "pub")
    # No FP8 units on the 910C: a precision missing here is refused, not approximated.
    peak_ops_per_s_per_die: Mapping[str, float] = fig(
        {"BF16": 354e12, "FP16": 376e12, "INT8": 752e12}, "est"
    )

    @property
    def hbm_bytes(self) -> int:
        return self.dies * self.hbm_bytes_per_die


@dataclass(frozen=True, kw_only=True)
class CpuProfile:
    """Kunpeng socket; four per node in a full NUMA mesh."""

    cores: int = fig(64, "assumed")
    dram_bytes: int = fig(512 * GiB, "assumed")
    # How much of a socket's DRAM goes into the node's memory pool; the rest stays addressable at
    # the CPU's own EID. Not published: the paper pools "the CPU DRAM" without giving a split.
    pooled_fraction: float = fig(0.75, "assumed")
    ub_bytes_per_s: float = fig(160 * GB, "pub")
    numa_local_distance: int = fig(10, "assumed")
    numa_remote_distance: int = fig(20, "assumed")

    @property
    def pooled_bytes(self) -> int:
        return int(self.dram_bytes * self.pooled_fraction)

    @property
    def local_bytes(self) -> int:
        return self.dram_bytes - self.pooled_bytes


@dataclass(frozen=True, kw_only=True)
class NodeProfile:
    npus: int = fig(8, "pub")
    cpus: int = fig(4, "pub")
    l1_chips: int = fig(7, "pub")


@dataclass(frozen=True, kw_only=True)
class SwitchProfile:
    """The UB switch tiers: L1 chips inside each node, L2 sub-planes across nodes."""

    l2_planes: int = fig(7, "pub")
    l2_chips_per_plane: int = fig(16, "pub")
    l2_ports_per_chip: int = fig(48, "pub")
    port_bytes_per_s: float = fig(28 * GB, "pub")


@dataclass(frozen=True, kw_only=True)
class UbCalibration:
    """Measured points of the real system that the UB cost model is fitted to."""

    small_read_bytes: int = fig(512, "pub")
    small_read_s: float = fig(1.2e-6, "pub")
    achieved_bytes_per_s_per_die: float = fig(167 * GB, "pub")
    # Published as bounds ("under 1 us", "under 3%"); the values inside the bounds are ours.
    cross_node_extra_latency_s: float = fig(0.6e-6, "assumed")
    cross_node_bandwidth_loss: float = fig(0.02, "assumed")


@dataclass(frozen=True, kw_only=True)
class MoeCalibration:
    """The measured MoE dispatch and combine at expert-parallel degree 8 (whole operation, software
    included). The cost model derives each op's fixed software overhead from these, so that the
    fabric's flow-level timing plus that overhead reproduces them exactly."""

    ep_ranks: int = fig(8, "pub")
    tokens_per_rank: int = fig(128, "pub")
    top_k: int = fig(8, "pub")
    dispatch_bytes_per_token: int = fig(7680, "pub")  # 7.5 KB: INT8 hidden state plus scales
    combine_bytes_per_token: int = fig(14336, "pub")  # 14 KB: BF16 hidden state
    dispatch_s: float = fig(116e-6, "pub")
    combine_s: float = fig(118e-6, "pub")
    # Other collectives: one launch cost each (not published; HCCL-class kernels launch in ~us).
    collective_launch_s: float = fig(5e-6, "assumed")


@dataclass(frozen=True, kw_only=True)
class EmsProfile:
    """The elastic memory store over the pools. The paper gives its shape (pooled DRAM, SSD below,
    consistent hashing, LRU, 128-512-token blocks); its sizes and speeds here are ours."""

    block_tokens_min: int = fig(128, "pub")
    block_tokens_max: int = fig(512, "pub")
    replication_factor: int = fig(2, "assumed")
    dram_share: float = fig(0.5, "assumed")  # of each memory pool
    ssd_bytes_per_node: int = fig(8 * 10**12, "assumed")
    ssd_bytes_per_s_per_node: float = fig(6e9, "assumed")
    ssd_latency_s: float = fig(100e-6, "assumed")
    # larger objects are size-only; those over chunk_bytes go by PutStream/GetStream
    real_object_max_bytes: int = fig(64 * 2**20, "assumed")
    chunk_bytes: int = fig(2**20, "assumed")  # one UB write or read; a CRC-32 each
    suspect_after_sweeps: int = fig(2, "assumed")  # missed in a row: reads avoid the pool
    dead_after_s: float = fig(30.0, "assumed")  # emulated seconds silent: its copies replaced
    object_max_bytes: int = fig(64 * GiB, "assumed")
    vnodes_per_pool: int = fig(64, "assumed")  # consistent-hash ring points per pool
    check_interval_s: float = fig(0.5, "assumed")  # emulated seconds between pool health sweeps


@dataclass(frozen=True, kw_only=True)
class EmulatorLimits:
    """Knobs of the emulator itself, not of the hardware."""

    # a memory pool holds whole EMS objects of real bytes (up to 64 MiB each, one copy per pool)
    stored_bytes_cap_per_device: int = fig(256 * 2**20, "assumed")
    inline_payload_max_bytes: int = fig(1 * 2**20, "assumed")
    inbox_max_messages: int = fig(1024, "assumed")
    region_alignment: int = fig(4096, "assumed")
    store_page_bytes: int = fig(4096, "assumed")
    collective_detail_max_flows: int = fig(20_000, "assumed")
    telemetry_interval_s: float = fig(10.0, "assumed")  # emulated seconds between samples
    telemetry_max_per_s: float = fig(200.0, "assumed")  # per process: the interval stretches
    event_buffer_max: int = fig(10_000, "assumed")  # per process, while the broker is away
    collective_max_flows: int = fig(2_000_000, "assumed")
    # collectives are timed on the fabric's own threads (never the default pool other work uses)
    collective_workers: int = fig(2, "assumed")
    collective_queue_max: int = fig(16, "assumed")  # waiting beyond these: RESOURCE_EXHAUSTED
    # Issue 9: a chaos tool must survive chaos. Every request is bounded in time and memory.
    operation_max_s: float = fig(3600.0, "assumed")  # emulated seconds one operation may take
    engine_backlog_max_s: float = fig(86_400.0, "assumed")  # emulated work queued on one die
    process_stored_bytes_cap: int = fig(2 * GiB, "assumed")  # real bytes of all devices held
    process_inbox_max_messages: int = fig(65_536, "assumed")  # queued SENDs, all devices
    process_inbox_max_bytes: int = fig(1 * GiB, "assumed")  # their inline payload bytes
    regions_max_per_device: int = fig(16_384, "assumed")
    list_regions_page_max: int = fig(1000, "assumed")  # ListRegions page size (and default)


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    npu: NpuProfile = field(default_factory=NpuProfile)
    cpu: CpuProfile = field(default_factory=CpuProfile)
    node: NodeProfile = field(default_factory=NodeProfile)
    switch: SwitchProfile = field(default_factory=SwitchProfile)
    ub: UbCalibration = field(default_factory=UbCalibration)
    moe: MoeCalibration = field(default_factory=MoeCalibration)
    ems: EmsProfile = field(default_factory=EmsProfile)
    limits: EmulatorLimits = field(default_factory=EmulatorLimits)

    @property
    def pool_bytes(self) -> int:
        """The size of a node's memory pool: the pooled share of each of its CPUs' DRAM."""
        return self.node.cpus * self.cpu.pooled_bytes


DEFAULT_PROFILE = HardwareProfile()


def figures(profile: HardwareProfile = DEFAULT_PROFILE) -> Iterator[tuple[str, Any, str]]:
    """Every figure as (dotted name, value, source), for documentation and `cmemu hardware`."""
    for part in dataclasses.fields(profile):
        section = getattr(profile, part.name)
        for item in dataclasses.fields(section):
            value = getattr(section, item.name)
            if isinstance(value, Mapping):
                value = dict(value)
            yield f"{part.name}.{item.name}", value, item.metadata.get("src", "")
