"""The hardware profile: every figure the models use, in one place, each with its source.

The emulator's own bounds and clock fidelity (not hardware) are sections of it too, declared in
emulator/model/emulatorprofile.py.

Sources follow ../shared/HARDWARE.md: ``pub`` (published by the vendor or in its 2025 serving
paper), ``est`` (a public modelling estimate) and ``assumed`` (not published: our default, keep it
configurable). A figure is read from here and nowhere else; a literal in a second place is a bug.

Units are SI base units throughout: bytes, bytes per second, seconds, operations per second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.emulatorprofile import ClockProfile, EmulatorLimits
from cmemu.emulator.model.provenance import GB, GiB, fig


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
    """A node: its NPUs, CPUs and L1 chips, and how many share a rack."""

    npus: int = fig(8, "pub")
    cpus: int = fig(4, "pub")
    l1_chips: int = fig(7, "pub")
    # cm384: 16 racks, 12 of compute with 4 nodes each (the other 4 hold the L2 switches)
    nodes_per_rack: int = fig(4, "pub")


@dataclass(frozen=True, kw_only=True)
class SwitchProfile:
    """The UB switch tiers: L1 chips inside each node, L2 sub-planes across nodes."""

    l2_planes: int = fig(7, "pub")
    l2_chips_per_plane: int = fig(16, "pub")
    l2_ports_per_chip: int = fig(48, "pub")
    port_bytes_per_s: float = fig(28 * GB, "pub")
    # a link-layer retransmission (a frame lost or failing CRC) costs the frame one replay round
    # trip on top of its resending (fault kind link-loss); not published
    link_retry_s: float = fig(1.0e-6, "assumed")
    # an L1 chip's 16 uplinks leave the node through optical modules; how many links one module
    # carries is not published (an 8-lane module: two per chip; fault kind optical-module)
    uplinks_per_optical_module: int = fig(8, "assumed")


@dataclass(frozen=True, kw_only=True)
class ScaleOutProfile:
    """The RDMA scale-out plane that joins supernodes (NPUs only). Published: 200 Gbps per die
    (`npu.rdma_bytes_per_s_per_die`), 400 per NPU, 3.2 Tbps per node, up to about 165K NPUs in 432
    supernodes. Its switches are not published: we assume a leaf per node, a spine tier per
    supernode and a core tier joining the supernodes' spines, non-blocking unless the
    oversubscription figures say otherwise; every such figure is labelled assumed."""

    max_supernodes: int = fig(432, "pub")  # "up to about 165K NPUs"
    spines_per_supernode: int = fig(8, "assumed")
    core_switches: int = fig(16, "assumed")
    # a leaf's uplinks carry its node's 3.2 Tbps divided by this; 1.0 is non-blocking
    leaf_oversubscription: float = fig(1.0, "assumed")
    # a spine's uplinks to the core carry what its leaves send it divided by this
    spine_oversubscription: float = fig(1.0, "assumed")
    nic_latency_s: float = fig(1.5e-6, "assumed")  # each end's RDMA NIC, one way
    switch_latency_s: float = fig(1.0e-6, "assumed")  # each switch crossed, one way
    efficiency: float = fig(0.9, "assumed")  # of a port's line rate achieved by RoCE traffic
    # A bound on a hang in the plane's data path, in emulated seconds (engines/deadline.py), so
    # that a starved host stretches it: a gateway waits this long for a peer gateway's agreement
    # to a connection or an op's landing there, and for its own NPU's Deliver, before the op
    # fails DEADLINE_EXCEEDED; never under the wall floor below (at a fast time scale its
    # emulated seconds are milliseconds, under one RPC between processes on a loaded host)
    peer_timeout_s: float = fig(30.0, "assumed")
    peer_timeout_min_wall_s: float = fig(5.0, "assumed")

    def latency_s(self, switches: int) -> float:
        """One way through both NICs and `switches` switches."""
        return 2 * self.nic_latency_s + switches * self.switch_latency_s


@dataclass(frozen=True, kw_only=True)
class UbCalibration:
    """Measured points of the real system that the UB cost model is fitted to: per die, inside one
    node, one transfer at a time. NPU -> NPU read is the reference the link graph's capacities are
    scaled to; the other rows price a transaction by its op and by its target's memory
    (costmodel.ub_point)."""

    # The die's raw UB bandwidth these rows were measured on (7 ports x 28 GB/s): a row over it
    # is the protocol's efficiency (costmodel.ub_efficiency), which a what-if on the ports
    # (npu.ub_port_bytes_per_s, npu.ub_ports_per_die) keeps, so the achieved rates follow them
    measured_on_bytes_per_s_per_die: float = fig(196 * GB, "pub")
    small_read_bytes: int = fig(512, "pub")  # the size of every small-transfer point below
    small_read_s: float = fig(1.2e-6, "pub")
    achieved_bytes_per_s_per_die: float = fig(167 * GB, "pub")  # NPU -> NPU read
    small_write_s: float = fig(1.3e-6, "pub")
    write_bytes_per_s_per_die: float = fig(137 * GB, "pub")  # NPU -> NPU write
    # NPU -> CPU memory (a CPU's DRAM or a node's memory pool)
    cpu_memory_small_read_s: float = fig(1.0e-6, "pub")
    cpu_memory_read_bytes_per_s: float = fig(151 * GB, "pub")
    cpu_memory_small_write_s: float = fig(1.1e-6, "pub")
    cpu_memory_write_bytes_per_s: float = fig(110 * GB, "pub")
    # Published as bounds ("under 1 us", "under 3%"); the values inside the bounds are ours.
    cross_node_extra_latency_s: float = fig(0.6e-6, "assumed")
    cross_node_bandwidth_loss: float = fig(0.02, "assumed")


@dataclass(frozen=True, kw_only=True)
class MoeCalibration:
    """The measured MoE dispatch and combine at expert-parallel degree 8 and 256 (128 tokens per
    rank, top-8; whole operation, software included). What the fabric's flow-level timing of each
    point leaves of the measured time is software, fitted as overhead = base + per_peer * (ranks
    - 1) (costmodel.moe_overhead_s): the fit reproduces both points."""

    ep_ranks: int = fig(8, "pub")
    tokens_per_rank: int = fig(128, "pub")
    top_k: int = fig(8, "pub")
    dispatch_bytes_per_token: int = fig(7680, "pub")  # 7.5 KB: INT8 hidden state plus scales
    combine_bytes_per_token: int = fig(14336, "pub")  # 14 KB: BF16 hidden state
    dispatch_s: float = fig(116e-6, "pub")
    combine_s: float = fig(118e-6, "pub")
    large_ep_ranks: int = fig(256, "pub")  # the same, measured at EP256 (on 128 NPUs)
    dispatch_large_s: float = fig(152e-6, "pub")
    combine_large_s: float = fig(149e-6, "pub")
    # Fitted on cm384 by collectives.fit_moe_overhead (tests/model/test_ub_calibration.py refits)
    dispatch_overhead_base_s: float = fig(78.81e-6, "fitted to pub")
    dispatch_overhead_per_peer_s: float = fig(96.75e-9, "fitted to pub")
    combine_overhead_base_s: float = fig(50.62e-6, "fitted to pub")
    combine_overhead_per_peer_s: float = fig(36.74e-9, "fitted to pub")
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
    # Bounds on a hang, in emulated seconds (engines/deadline.py): a pool that has not answered
    # by then is passed by and suspect. Emulated, so that a starved host stretches them.
    io_timeout_s: float = fig(20.0, "assumed")  # one UB transaction of EMS
    call_timeout_s: float = fig(5.0, "assumed")  # a region's allocation or free
    probe_timeout_s: float = fig(1.0, "assumed")  # a sweep's wait for a pool's fault state
    # wall seconds each of the three bounds lasts at least: at a fast time scale (x1000: 20 ms
    # of wall) a loaded host's scheduling alone outlasted them and failed healthy pools' calls
    timeout_min_wall_s: float = fig(2.0, "assumed")


@dataclass(frozen=True, kw_only=True)
class SchedulerProfile:
    """The reference scheduler's defaults. The paper says spares are kept and faulty NPUs are
    replaced from them, not how many: one per rack is ours (SetSpares changes it live)."""

    spares_per_rack: int = fig(1, "assumed")


@dataclass(frozen=True, kw_only=True)
class ManagerProfile:
    """The cluster manager's detection and the recovery targets it is judged by. The published
    figures are the goal (recovery within 10 minutes, 40-day training runs); how often a device
    is heartbeated and after how many misses it is failed are not published: ours."""

    recovery_target_s: float = fig(600.0, "pub")  # "recovery within 10 minutes"
    training_run_s: float = fig(40 * 86_400.0, "pub")  # "40-day" uninterrupted training runs
    heartbeat_interval_s: float = fig(5.0, "assumed")  # emulated seconds between two checks
    heartbeat_deadline_s: float = fig(2.0, "assumed")  # emulated seconds a check may take
    misses_to_fail: int = fig(3, "assumed")  # missed in a row: failed (a hang)
    # Wall-clock cap on heartbeats per second in one manager: on cm384 (624 devices) at a fast
    # time scale the interval stretches rather than the manager swamping a shared core.
    heartbeats_max_per_s: float = fig(400.0, "assumed")
    # Never shorter in wall time: a loaded host stalls an event loop for tens of milliseconds,
    # and three stalls in a row must not fail a healthy device at a fast time scale.
    heartbeat_deadline_min_wall_s: float = fig(0.5, "assumed")
    # More than this share of its devices silent at once (their liveness streams broken or
    # quiet): the manager suspects itself cut off (a partition of the manager, its own host's
    # network) and fails none of them on that silence. Kubernetes' node lifecycle controller
    # stops evicting for the same reason past its unhealthy-zone-threshold, 0.55 by default.
    cut_off_share: float = fig(0.55, "assumed")
    # Straggler (slow-device) detection from the fabric's collective arrivals
    # (emulator/model/manager/straggler.py): an NPU whose dies were ready at least
    # `straggler_lag_ratio` times as late as the collective's median rank in at least
    # `straggler_consistency` of its last `straggler_samples` collectives (all within
    # `straggler_window_s`) is a straggler. 1.5 flags a rank at two thirds of its peers' pace or
    # slower, not the jitter of a healthy one; 2 of 3 lets a training job whose step runs one
    # collective be judged in two steps after the slowdown, and no one-off late arrival.
    straggler_lag_ratio: float = fig(1.5, "assumed")
    straggler_samples: int = fig(3, "assumed")  # its last collectives judged (fewer: not yet)
    straggler_consistency: float = fig(0.66, "assumed")  # share of them it must be late in
    straggler_window_s: float = fig(300.0, "assumed")  # emulated: older arrivals are forgotten
    straggler_poll_s: float = fig(1.0, "assumed")  # emulated seconds between two reads
    # An isolated straggler runs a diagnostic kernel this often (emulated) and returns to
    # service once its achieved time is within straggler_lag_ratio of the roofline's.
    straggler_probe_s: float = fig(10.0, "assumed")
    straggler_probe_flops: float = fig(1e12, "assumed")  # BF16 operations: ~3 ms on a die


@dataclass(frozen=True, kw_only=True)
class TrainingProfile:
    """A training job's defaults and its recovery costs (MTBF and restart costs are not
    published for the 910C: ours, and parameters of `cmemu simulate training`)."""

    default_model: str = fig("deepseek-v3", "assumed")
    tokens_per_die: int = fig(4096, "assumed")  # one micro-batch's tokens on each die
    backward_factor: float = fig(2.0, "assumed")  # backward pass = 2x the forward's compute
    # Optimizer state per parameter: BF16 weights + FP32 master + two Adam moments.
    checkpoint_bytes_per_param: float = fig(14.0, "assumed")
    gradient_bytes_per_param: float = fig(2.0, "assumed")  # BF16 gradients all-reduced
    gradient_bucket_bytes: int = fig(1 * GiB, "assumed")  # all-reduced one bucket at a time
    repair_s: float = fig(24 * 3600.0, "assumed")  # a failed NPU back among the spares
    checkpoint_every: int = fig(100, "assumed")  # steps between two checkpoints
    # the latest and the one before it, kept in EMS: a corrupt latest one falls back a step
    checkpoints_kept: int = fig(2, "assumed")
    checkpoint_object_max_bytes: int = fig(64 * GiB, "assumed")  # one EMS object per shard
    restart_s: float = fig(60.0, "assumed")  # process restart and re-init on the new NPUs
    replace_s: float = fig(120.0, "assumed")  # detection, isolation and spare hand-over
    mtbf_hours_per_npu: float = fig(50_000.0, "assumed")  # a year's MTBF is ~8,760 h
    step_retry_s: float = fig(1.0, "assumed")  # emulated seconds before a failed step is rerun
    # Bounds on a hang, in emulated seconds (engines/deadline.py), so that a starved host, whose
    # clock the governor slows, stretches them: a step's collectives (a hung rank holds them
    # past it), and an ended job's runner and the scheduler giving its NPUs back before its name
    # starts again (one RPC each: a hung scheduler past it)
    step_deadline_s: float = fig(30.0, "assumed")
    release_wait_s: float = fig(10.0, "assumed")
    # ... never shorter in wall time: at a fast time scale their emulated seconds are wall
    # milliseconds, less than one RPC takes on a loaded host
    deadline_min_wall_s: float = fig(5.0, "assumed")


@dataclass(frozen=True, kw_only=True)
class ServingCalibration:
    """Serving DeepSeek-R1 (issue 10): the measured points the serving cost model is fitted to,
    the assumptions it needs, and the parameters fitted to the points (src "fit": see
    emulator/model/serving/calibrate.py, which reports the model's error on every point).

    "Per NPU" in the published serving figures is per 910C package (two dies): the paper's
    efficiencies (1.29 decode and 4.45 prefill tokens/s per TFLOPS) divide by the package's INT8
    peak, and 1,943 tokens/s at TPOT 49.4 ms is 96 requests per NPU, so 48 per die."""

    # --- published points --------------------------------------------------------------------
    decode_tpot_s: float = fig(49.4e-3, "pub")
    decode_tokens_per_s_per_npu: float = fig(1943.0, "pub")
    decode_batch_per_npu: int = fig(96, "pub")
    decode_kv_tokens: int = fig(4096, "pub")
    decode_ep: int = fig(320, "pub")
    prefill_tokens_per_s_per_npu: float = fig(5655.0, "pub")
    prefill_batch_tokens: int = fig(16384, "pub")
    prefill_prompt_tokens: int = fig(4096, "pub")
    prefill_ep: int = fig(32, "pub")
    mla_compute_utilisation: float = fig(0.654, "pub")
    # the MLA kernel's measured 1,346 GB/s of the die's 1,600 GB/s: a dimensionless efficiency,
    # applied to `npu.hbm_bytes_per_s_per_die`, so faster HBM makes memory-bound kernels faster
    hbm_efficiency: float = fig(1346 / 1600, "pub")
    int8_gemm_utilisation: float = fig(0.80, "pub")  # published 77-83%: the middle
    mtp_tokens_per_step: float = fig(1.7, "pub")  # at 70% acceptance
    layer_s: float = fig(874e-6, "pub")  # one decode layer without MTP
    layer_s_mtp: float = fig(1260e-6, "pub")  # with MTP
    graph_launch_s: float = fig(0.7e-3, "pub")  # published 0.6-0.8 ms: the middle
    microbatch_decode_gain: tuple[float, float] = fig((0.058, 0.094), "pub")
    microbatch_prefill_gain: tuple[float, float] = fig((0.23, 0.31), "pub")
    block_tokens: int = fig(512, "pub")  # EMS prefix blocks (and the Mooncake trace's)
    # --- assumptions --------------------------------------------------------------------------
    weight_bytes_per_param: float = fig(1.0, "pub")  # INT8 weights
    kv_bytes_per_element: float = fig(1.0, "assumed")  # INT8 KV cache (35 KB per token)
    # Routed-expert load skew of real traffic (Zipf exponent over the 256 experts) for the default
    # placement; a perfectly balanced placement has imbalance 1.
    expert_load_zipf: float = fig(0.25, "assumed")
    ems_lookup_s: float = fig(50e-6, "assumed")  # one MatchPrefix: metadata hops, no data
    # HBM a die keeps out of the KV cache: runtime, compiled graphs, collective buffers
    # (emulator/model/serving/hbm.py); activations are BF16 while they live
    hbm_reserved_bytes_per_die: int = fig(4 * GiB, "assumed")
    activation_bytes_per_element: float = fig(2.0, "assumed")
    # on-demand admission (decode.admission): a request joins only while its die keeps this share
    # of its KV budget free beside it, so the next steps' growth does not preempt at once
    # (vLLM's block manager keeps a watermark of 1% of its blocks for the same reason)
    admission_watermark: float = fig(0.01, "assumed")
    # --- kernels and their launches (issue 23 item 1: emulator/model/serving/kernels.py) ---------
    # kernels one microbatch launches per layer: input norm, the fused MLA prolog (projections,
    # RoPE, KV write), attention, output projection, norm and residual, gate and top-k ...
    kernels_attention: int = fig(6, "assumed")
    # ... the routed experts' two grouped GEMMs and their activation, the shared expert, the
    # weighted sum (a dense layer's FFN: as many)
    kernels_ffn: int = fig(5, "assumed")
    kernels_head: int = fig(3, "assumed")  # final norm, LM head, sampling
    # --- fitted (calibrate.py fits them; the test asserts the fit holds) -----------------------
    # one kernel's launch inside a captured graph: the next task's issue and synchronisation
    kernel_launch_s: float = fig(9.327e-6, "fit")
    # the share of a launch that holds the die's cores (setup, synchronisation); the rest is the
    # stream waiting for the task's issue, when another microbatch's kernels may run
    launch_core_share: float = fig(0.4126, "fit")
    # decode's kernels, run two streams at a time on shared cores, reach this share of their
    # measured stand-alone compute rates (dimensionless, <= 1)
    decode_compute_efficiency: float = fig(0.7763, "fit")
    # prefill's kernels (long sequences, non-absorbed MLA) reach this share of the measured
    # compute rates (dimensionless, <= 1)
    prefill_compute_efficiency: float = fig(0.5284, "fit")
    # --- predicted, never fitted: the paper's decode rows at tighter TPOT targets (EP320, MTP,
    # KV 4096), as (requests per NPU, tokens/s per NPU); not in HARDWARE.md on purpose, they
    # check the structure of the step model. The abstract's: 538 tokens/s per NPU under a 15 ms
    # TPOT (8 per NPU, TPOT 14.9 ms); the 30 ms row, 974 at TPOT 24.6 ms (24 per NPU), as public
    # notes reproducing the paper's table give it (read there, not in the paper itself).
    decode_small_batch_rows: tuple[tuple[int, float], ...] = fig(((24, 974.0), (8, 538.0)), "pub")
    # The paper's prefill throughput (its Table 2) with a perfectly balanced expert load ("perfect
    # EPLB", a projection), beside the default's 5,655: abstract and Table 2, 4.45 tokens/s per
    # TFLOPS of a 910C's 1,504 INT8 TOPS. Predicted by the placement model, never fitted.
    prefill_tokens_per_s_per_npu_perfect_eplb: float = fig(6688.0, "pub")
    # --- EMS model caching (the router's weight loading): 671 GB of INT8 weights for 8 instances
    cache_weights_bytes: float = fig(671e9, "pub")
    cache_instances: int = fig(8, "pub")
    cache_cold_s: float = fig(2560.0, "pub")  # from object storage at 2.5 GB/s
    cache_from_ems_s: float = fig(320.0, "pub")  # the same weights already in EMS
    # the published 5 s warm switch is not modelled: every deployment loads its weights
    # expert slots: a tenth of the slots hold shared-expert copies and a tenth redundant copies
    # (decode EP320: 32 + 32 of 320 dies; prefill EP32: 1 + 1 of 10 slots per die)
    shared_slot_fraction: float = fig(0.1, "pub")
    redundant_slot_fraction: float = fig(0.1, "pub")
    # --- riding out a lost die (issue 11): not published, ours ------------------------------
    max_request_retries: int = fig(3, "assumed")  # failed steps a request survives, then fails
    step_retry_s: float = fig(1.0, "assumed")  # emulated seconds a failed step costs
    step_deadline_s: float = fig(10.0, "assumed")  # emulated seconds a step's measure may take
    # emulated seconds a KV region's allocation or release on an NPU may take (a hung NPU is
    # given up on): one call that answers at once, bounded in emulated time so that a starved
    # host stretches it (engines/deadline.py)
    kv_region_timeout_s: float = fig(5.0, "assumed")
    # the wall floor of the serving bounds above (and of the router's probe of an NPU): at a
    # fast time scale their emulated seconds are wall milliseconds, below a loaded loop's stalls
    step_deadline_min_wall_s: float = fig(5.0, "assumed")
    # --- tenants' priority classes (issue 24): the share of a deployment's decode slots a class
    # may fill before its requests wait (online: all of them)
    tenant_near_line_share: float = fig(0.9, "assumed")
    tenant_offline_share: float = fig(0.5, "assumed")
    # --- the kv-aware router's cost (emulator/model/serving/router.py) ------------------------
    # Dynamo's KV router: cost = overlap_score_weight x blocks to prefill + blocks of load; its
    # default weight is 1 (docs.nvidia.com/dynamo, KV Router)
    router_overlap_weight: float = fig(1.0, "pub")
    # SGLang's cache-aware fallback to the least loaded: its relative threshold is its default
    # (1.5); its absolute one (64 requests) is ours in blocks of prefill work: one full prefill
    # batch (16,384 tokens), since a prefill instance holds few requests at once
    router_balance_rel: float = fig(1.5, "pub")
    router_balance_abs_blocks: float = fig(32.0, "assumed")
    # HBM a prefill die keeps for prompts' KV blocks after their prefill (the prefix the
    # kv-aware router finds there, needing no load from EMS); LRU beyond it
    prefill_prefix_bytes_per_die: int = fig(8 * GiB, "assumed")


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """Every figure the models use, by section; the emulator's own bounds and clock beside them."""

    npu: NpuProfile = field(default_factory=NpuProfile)
    cpu: CpuProfile = field(default_factory=CpuProfile)
    node: NodeProfile = field(default_factory=NodeProfile)
    switch: SwitchProfile = field(default_factory=SwitchProfile)
    scaleout: ScaleOutProfile = field(default_factory=ScaleOutProfile)
    ub: UbCalibration = field(default_factory=UbCalibration)
    moe: MoeCalibration = field(default_factory=MoeCalibration)
    ems: EmsProfile = field(default_factory=EmsProfile)
    scheduler: SchedulerProfile = field(default_factory=SchedulerProfile)
    manager: ManagerProfile = field(default_factory=ManagerProfile)
    training: TrainingProfile = field(default_factory=TrainingProfile)
    serving: ServingCalibration = field(default_factory=ServingCalibration)
    # not hardware: the emulator's own bounds and fidelity (emulator/model/emulatorprofile.py)
    limits: EmulatorLimits = field(default_factory=EmulatorLimits)
    clock: ClockProfile = field(default_factory=ClockProfile)

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
