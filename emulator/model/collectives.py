"""Collectives as flows: each algorithm lists its phases of (source rank, destination rank, bytes);
each phase is timed by the flow simulator on the live link graph, with contention, and the phases
run one after another. No closed formula: what the links can carry decides.

The algorithms are the direct ones an all-to-all fabric favours (every rank talks to every other
rank at once), registered by name in ALGORITHMS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from emulator.model.costmodel import (
    endpoint_latency_s,
    hop_latency_s,
    moe_bytes_per_token,
    moe_overhead_s,
)
from emulator.model.errors import InvalidArgumentError, OutOfRangeError, UnavailableError
from emulator.model.flowsim import FlowBatch, simulate, weighted_sum
from emulator.model.linkgraph import Endpoint, LinkGraph

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class CollectiveSpec:
    op: str
    bytes: int = 0
    bytes_per_pair: int = 0
    pair_bytes: tuple[int, ...] = ()
    root: int = 0
    tokens_per_rank: int = 0
    top_k: int = 8
    bytes_per_token: int = 0


@dataclass(frozen=True)
class Phase:
    src: IntArray
    dst: IntArray
    nbytes: FloatArray


@dataclass
class CollectiveTiming:
    phases: int
    flows: int
    total_bytes: float
    transfer_s: float
    overhead_s: float
    flow_src: IntArray
    flow_dst: IntArray
    flow_bytes: FloatArray
    flow_complete_s: FloatArray  # from the collective's start
    flow_gb_s: FloatArray
    res_bytes: FloatArray

    @property
    def duration_s(self) -> float:
        return self.transfer_s + self.overhead_s


def _pairs(n: int) -> tuple[IntArray, IntArray]:
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    mask = src != dst
    return src[mask].astype(np.int64), dst[mask].astype(np.int64)


def _mesh(n: int, per_pair: float) -> Phase:
    src, dst = _pairs(n)
    return Phase(src, dst, np.full(len(src), float(per_pair)))


def _need(value: int, name: str) -> int:
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be > 0")
    return value


def _all_to_all(n: int, spec: CollectiveSpec) -> list[Phase]:
    if spec.pair_bytes:
        if len(spec.pair_bytes) != n * n:
            raise InvalidArgumentError(
                f"pair_bytes needs {n}x{n} = {n * n} entries, got {len(spec.pair_bytes)}"
            )
        matrix = np.array(spec.pair_bytes, dtype=np.float64).reshape(n, n)
        src, dst = _pairs(n)
        return [Phase(src, dst, matrix[src, dst])]
    return [_mesh(n, _need(spec.bytes_per_pair, "bytes_per_pair (or pair_bytes)"))]


def _all_gather(n: int, spec: CollectiveSpec) -> list[Phase]:
    return [_mesh(n, _need(spec.bytes, "bytes"))]


def _reduce_scatter(n: int, spec: CollectiveSpec) -> list[Phase]:
    return [_mesh(n, _need(spec.bytes, "bytes") / n)]


def _all_reduce(n: int, spec: CollectiveSpec) -> list[Phase]:
    shard = _need(spec.bytes, "bytes") / n
    return [_mesh(n, shard), _mesh(n, shard)]  # reduce-scatter, then all-gather of the shards


def _broadcast(n: int, spec: CollectiveSpec) -> list[Phase]:
    if spec.root >= n:
        raise OutOfRangeError(f"root {spec.root} is not a rank (0..{n - 1})")
    dst = np.array([r for r in range(n) if r != spec.root], dtype=np.int64)
    src = np.full(len(dst), spec.root, dtype=np.int64)
    return [Phase(src, dst, np.full(len(dst), float(_need(spec.bytes, "bytes"))))]


def _moe(op: str) -> Callable[[int, CollectiveSpec], list[Phase]]:
    def phases(n: int, spec: CollectiveSpec) -> list[Phase]:
        tokens = _need(spec.tokens_per_rank, "tokens_per_rank")
        per_token = spec.bytes_per_token or 0
        copies = tokens * _need(spec.top_k, "top_k")
        return [_mesh(n, copies * per_token / n)]

    phases.__doc__ = f"MoE {op}: every rank's token copies spread evenly over all ranks."
    return phases


@dataclass(frozen=True)
class Algorithm:
    phases: Callable[[int, CollectiveSpec], list[Phase]]
    moe: str | None = None  # "dispatch" or "combine": overhead fitted to the calibration point


ALGORITHMS: dict[str, Algorithm] = {
    "all-to-all": Algorithm(_all_to_all),
    "all-gather": Algorithm(_all_gather),
    "reduce-scatter": Algorithm(_reduce_scatter),
    "all-reduce": Algorithm(_all_reduce),
    "broadcast": Algorithm(_broadcast),
    "moe-dispatch": Algorithm(_moe("dispatch"), moe="dispatch"),
    "moe-combine": Algorithm(_moe("combine"), moe="combine"),
}


class DieFlows:
    """Vectorised routes between NPU dies: the same rules as LinkGraph.route, for 100,000 pairs."""

    def __init__(self, graph: LinkGraph, ranks: list[Endpoint]) -> None:
        self.graph = graph
        cap = graph.link_cap()
        planes = graph.planes
        extra = graph.trunk_extra_latency()
        nodes = sorted({e.device.node for e in ranks})
        node_index = {n: i for i, n in enumerate(nodes)}
        self.node = np.array([node_index[e.device.node] for e in ranks], dtype=np.int64)
        npu_index: dict[str, int] = {}
        self.npu = np.array(
            [npu_index.setdefault(e.device.id, len(npu_index)) for e in ranks], dtype=np.int64
        )
        self.out = np.array([e.out[0][0] for e in ranks], dtype=np.int64)
        self.inn = np.array([e.inn[0][0] for e in ranks], dtype=np.int64)
        # an NPU die has exactly one port per plane
        self.out_pc = cap[np.array([[p[0] for p in e.out_ports] for e in ranks], dtype=np.int64)]
        self.in_pc = cap[np.array([[p[0] for p in e.in_ports] for e in ranks], dtype=np.int64)]
        self.up = np.array([graph.trunk(f"{n}:up") for n in nodes], dtype=np.int64)
        self.down = np.array([graph.trunk(f"{n}:down") for n in nodes], dtype=np.int64)
        self.up_pc = np.array(
            [[graph._uplink(n, p, cap, down=False)[0] for p in range(planes)] for n in nodes]
        )
        self.down_pc = np.array(
            [[graph._uplink(n, p, cap, down=True)[0] for p in range(planes)] for n in nodes]
        )
        by_npu: dict[str, list[int]] = {}
        for i, e in enumerate(ranks):
            by_npu.setdefault(e.device.id, []).append(i)
        self.sibling: dict[tuple[int, int], tuple[int, float]] = {}
        for members in by_npu.values():
            for i in members:
                for j in members:
                    if i != j:
                        name = f"{ranks[i].name}>{ranks[j].name}"
                        self.sibling[(i, j)] = (graph.trunk(name), float(cap[graph._index[name]]))
        # a cross-node flow also meets one L1->L2 link per plane at each end
        self.out_x = np.minimum(self.out_pc, self.up_pc[self.node])
        self.in_x = np.minimum(self.in_pc, self.down_pc[self.node])
        self.extra = extra
        self.endpoint_s = endpoint_latency_s(graph.profile)
        self.hop_s = hop_latency_s(graph.profile)
        devices = [e.device.id for e in ranks]
        for x, y in graph.partitions:
            sides = {d for d in devices if d in x}, {d for d in devices if d in y}
            if all(sides):
                raise UnavailableError(
                    f"ranks span a partition: {sorted(sides[0])[0]} / {sorted(sides[1])[0]}"
                )

    def batch(self, phase: Phase) -> FlowBatch:
        keep = phase.nbytes > 0
        src, dst, nbytes = phase.src[keep], phase.dst[keep], phase.nbytes[keep]
        n = len(src)
        flows = np.arange(n, dtype=np.int64)
        sib = self.npu[src] == self.npu[dst]
        cross = (self.node[src] != self.node[dst]) & ~sib
        same = ~sib & ~cross
        cap = np.where(
            cross,
            _pair_caps(self.out_x, self.in_x, src, dst),
            _pair_caps(self.out_pc, self.in_pc, src, dst),
        )
        latency = np.full(n, self.endpoint_s)
        latency[same] += self.hop_s
        latency[cross] += 3 * self.hop_s
        inc_flow = [flows[~sib], flows[~sib], flows[cross], flows[cross]]
        inc_res = [
            self.out[src[~sib]],
            self.inn[dst[~sib]],
            self.up[self.node[src[cross]]],
            self.down[self.node[dst[cross]]],
        ]
        for f in np.flatnonzero(sib):
            trunk, d2d_cap = self.sibling[(int(src[f]), int(dst[f]))]
            inc_flow.append(np.array([f], dtype=np.int64))
            inc_res.append(np.array([trunk], dtype=np.int64))
            cap[f] = d2d_cap
        all_flow = np.concatenate(inc_flow)
        all_res = np.concatenate(inc_res)
        if self.extra.any():
            latency += weighted_sum(all_flow, self.extra[all_res], n)
        if (cap <= 0).any():
            dead = int(np.flatnonzero(cap <= 0)[0])
            raise UnavailableError(
                f"no live UB plane between ranks {int(src[dead])} and {int(dst[dead])}"
            )
        return FlowBatch(
            inc_flow=all_flow,
            inc_res=all_res,
            inc_w=np.ones(len(all_flow)),
            flow_cap=cap,
            nbytes=nbytes,
            latency_s=latency,
        )


def _pair_caps(out_pc: FloatArray, in_pc: FloatArray, src: IntArray, dst: IntArray) -> FloatArray:
    """Sum over planes of min(source port, destination port), for every (src, dst) pair.
    Ranks mostly share a few distinct rows (all equal without faults), so the plane-wise minimum is
    taken once per distinct pair of rows, not once per flow."""
    out_rows, out_of = np.unique(out_pc, axis=0, return_inverse=True)
    in_rows, in_of = np.unique(in_pc, axis=0, return_inverse=True)
    table: FloatArray = np.minimum(out_rows[:, None, :], in_rows[None, :, :]).sum(axis=2)
    pair_caps: FloatArray = table[out_of.ravel()[src], in_of.ravel()[dst]]
    return pair_caps


def run_collective(
    graph: LinkGraph, ranks: list[Endpoint], spec: CollectiveSpec
) -> CollectiveTiming:
    algorithm = ALGORITHMS.get(spec.op)
    if algorithm is None:
        raise InvalidArgumentError(
            f"unknown collective {spec.op!r}; known: {', '.join(ALGORITHMS)}"
        )
    profile = graph.profile
    if algorithm.moe is not None and not spec.bytes_per_token:
        spec = CollectiveSpec(
            **{**spec.__dict__, "bytes_per_token": moe_bytes_per_token(algorithm.moe, profile)}
        )
    phases = algorithm.phases(len(ranks), spec)
    flows = sum(len(p.src) for p in phases)
    if flows > profile.limits.collective_max_flows:
        raise InvalidArgumentError(
            f"{flows} flows exceed the limit of {profile.limits.collective_max_flows}"
        )
    routes = DieFlows(graph, ranks)
    caps = graph.trunk_cap()
    start = 0.0
    res_bytes = np.zeros(len(caps))
    parts: list[tuple[IntArray, IntArray, FloatArray, FloatArray, FloatArray]] = []
    for phase in phases:
        batch = routes.batch(phase)
        if batch.size == 0:
            continue
        result = simulate(batch, caps)
        keep = phase.nbytes > 0
        gb_s = batch.nbytes / np.maximum(result.fluid_end_s, 1e-30) / 1e9
        parts.append(
            (phase.src[keep], phase.dst[keep], batch.nbytes, start + result.complete_s, gb_s)
        )
        start += float(result.complete_s.max())
        res_bytes += result.res_bytes
    if not parts:
        raise InvalidArgumentError("the collective moves no bytes")
    overhead = (
        moe_overhead_s(algorithm.moe, profile) if algorithm.moe else profile.moe.collective_launch_s
    )
    cat = [np.concatenate([p[i] for p in parts]) for i in range(5)]
    return CollectiveTiming(
        phases=len(parts),
        flows=len(cat[0]),
        total_bytes=float(cat[2].sum()),
        transfer_s=start,
        overhead_s=overhead,
        flow_src=cat[0],
        flow_dst=cat[1],
        flow_bytes=cat[2],
        flow_complete_s=cat[3],
        flow_gb_s=cat[4],
        res_bytes=res_bytes,
    )
