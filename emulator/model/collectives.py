"""Collectives as flows: each algorithm lists its phases of (source rank, destination rank, bytes);
each phase is timed by the flow simulator on the live link graph, with contention, and the phases
run one after another. No closed formula: what the links can carry decides.

The algorithms are the direct ones an all-to-all fabric favours (every rank talks to every other
rank at once), registered by name in ALGORITHMS.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.collectivespec import COLLECTIVE_OPS, CollectiveSpec
from cmemu.emulator.model.costmodel import (
    check_duration,
    moe_bytes_per_token,
    moe_overhead_s,
    moe_points,
)
from cmemu.emulator.model.endpoints import Endpoint
from cmemu.emulator.model.errors import InvalidArgumentError, OutOfRangeError, UnavailableError
from cmemu.emulator.model.fairshare import Crossings, weighted_sum
from cmemu.emulator.model.flowsim import FlowBatch, simulate
from cmemu.emulator.model.linkgraph import LinkGraph
from cmemu.emulator.model.route import RouteKind, base_latency_s
from cmemu.emulator.model.routes import flow_plane_caps, l2_plane_caps
from cmemu.emulator.model.topology import DeviceKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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


@functools.lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[IntArray, IntArray]:
    """Every ordered pair of distinct ranks: shared by every phase over n ranks (read-only),
    so that DieFlows knows the pairs it routed last by identity."""
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    mask = src != dst
    pairs = src[mask].astype(np.int64), dst[mask].astype(np.int64)
    for a in pairs:
        a.flags.writeable = False
    return pairs


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


ALGORITHMS: dict[str, Algorithm] = {  # every op of COLLECTIVE_OPS (collectivespec.py)
    "all-to-all": Algorithm(_all_to_all),
    "all-gather": Algorithm(_all_gather),
    "reduce-scatter": Algorithm(_reduce_scatter),
    "all-reduce": Algorithm(_all_reduce),
    "broadcast": Algorithm(_broadcast),
    "moe-dispatch": Algorithm(_moe("dispatch"), moe="dispatch"),
    "moe-combine": Algorithm(_moe("combine"), moe="combine"),
}
assert set(ALGORITHMS) == set(COLLECTIVE_OPS)


class DieFlows:
    """Routes between NPU dies for a whole collective at once. The rules are the link graph's
    (LinkGraph.port_caps, l2_caps, die_link, route.base_latency_s, with l2_plane_caps and
    flow_plane_caps), which LinkGraph.route applies to one pair: here they are applied to
    100,000 pairs in array form. Ceilings depend only on a flow's (source row, destination row,
    node pair), and ranks share few distinct rows (all equal without faults), so each distinct
    combination is computed once."""

    def __init__(self, graph: LinkGraph, ranks: list[Endpoint]) -> None:
        self.graph = graph
        nodes = sorted({e.device.node for e in ranks})
        node_index = {n: i for i, n in enumerate(nodes)}
        self.n_nodes = len(nodes)
        self.node = np.array([node_index[e.device.node] for e in ranks], dtype=np.int64)
        npu_index: dict[str, int] = {}
        self.npu = np.array(
            [npu_index.setdefault(e.device.id, len(npu_index)) for e in ranks], dtype=np.int64
        )
        self.out = np.array([e.out[0][0] for e in ranks], dtype=np.int64)
        self.inn = np.array([e.inn[0][0] for e in ranks], dtype=np.int64)
        self.up = np.array([graph.uplink_trunk(n) for n in nodes], dtype=np.int64)
        self.down = np.array([graph.downlink_trunk(n) for n in nodes], dtype=np.int64)
        rows = np.array([e.row for e in ranks], dtype=np.int64)
        node_rows = np.array([graph.node_row[n] for n in nodes], dtype=np.int64)
        out_pc = graph.port_caps()[rows]
        in_pc = graph.port_caps(inbound=True)[rows]
        up = graph.l2_caps()[node_rows]
        down = graph.l2_caps(down=True)[node_rows]
        l2 = l2_plane_caps(up[:, None], down[None, :]).reshape(len(nodes) ** 2, graph.planes)
        self.out_rows, self.out_of = _distinct(out_pc)
        self.in_rows, self.in_of = _distinct(in_pc)
        self.l2_rows, self.l2_of = _distinct(l2)
        self.same_table = flow_plane_caps(self.out_rows[:, None], self.in_rows[None, :]).sum(-1)
        self.cross_table = flow_plane_caps(
            self.out_rows[:, None, None], self.in_rows[None, :, None], self.l2_rows[None, None, :]
        ).sum(-1)
        self.sibling: dict[tuple[int, int], tuple[int, float]] = {}
        by_npu: dict[int, list[int]] = {}
        for i, n in enumerate(self.npu.tolist()):
            by_npu.setdefault(n, []).append(i)
        for members in by_npu.values():
            for i in members:
                for j in members:
                    link = graph.die_link(ranks[i], ranks[j])
                    if link is not None:
                        self.sibling[(i, j)] = link
        self.extra = graph.trunk_extra_latency()
        # by kind code: 0 sibling dies, 1 same node, 2 across nodes
        self.base_latency = np.array(
            [
                base_latency_s(graph.profile, kind)
                for kind in (RouteKind.SIBLING, RouteKind.SAME_NODE, RouteKind.CROSS_NODE)
            ]
        )
        devices = [e.device.id for e in ranks]
        for x, y, _ in graph.partitions:  # a collective needs both ways: one way cuts it too
            sides = {d for d in devices if d in x}, {d for d in devices if d in y}
            if all(sides):
                raise UnavailableError(
                    f"ranks span a partition: {sorted(sides[0])[0]} / {sorted(sides[1])[0]}"
                )
        self._last: tuple[IntArray, IntArray, PairRoutes] | None = None

    def batch(self, phase: Phase) -> FlowBatch:
        """The phase's flows of more than 0 bytes, with their routes. The routes of the last
        set of pairs are kept: an all-reduce's two phases, and a MoE layer's dispatch after
        dispatch, move different bytes between the same pairs."""
        src, dst, nbytes = _moving(phase)
        last = self._last
        if last is None or not (_same(last[0], src) and _same(last[1], dst)):
            last = self._last = (src, dst, self._route(src, dst))
        routes = last[2]
        return FlowBatch.crossing(
            routes.crossings, flow_cap=routes.flow_cap, nbytes=nbytes, latency_s=routes.latency_s
        )

    def _route(self, src: IntArray, dst: IntArray) -> PairRoutes:
        n = len(src)
        sib = np.zeros(n, dtype=bool)
        sib_caps: list[tuple[int, int, float]] = []
        for f in np.flatnonzero(self.npu[src] == self.npu[dst]).tolist():
            link = self.sibling.get((int(src[f]), int(dst[f])))
            if link is not None:
                sib[f] = True
                sib_caps.append((f, *link))
        cross = (self.node[src] != self.node[dst]) & ~sib
        same = ~sib & ~cross
        kind = np.where(cross, 2, np.where(same, 1, 0))
        latency = self.base_latency[kind]
        out_of, in_of = self.out_of[src], self.in_of[dst]
        cap = np.where(
            cross,
            self.cross_table[
                out_of, in_of, self.l2_of[self.node[src] * self.n_nodes + self.node[dst]]
            ],
            self.same_table[out_of, in_of],
        )
        # one row per slot (Crossings): the die's ports out and in, then across nodes the
        # source node's uplinks and the destination node's downlinks; a sibling flow crosses
        # its die-to-die link only
        res = np.full((4, n), -1, dtype=np.int64)
        res[0, ~sib] = self.out[src[~sib]]
        res[1, ~sib] = self.inn[dst[~sib]]
        res[2, cross] = self.up[self.node[src[cross]]]
        res[3, cross] = self.down[self.node[dst[cross]]]
        if sib_caps:
            f_sib, trunk, d2d_cap = (np.array(c) for c in zip(*sib_caps, strict=True))
            res[0, f_sib.astype(np.int64)] = trunk.astype(np.int64)
            cap[f_sib.astype(np.int64)] = d2d_cap
        crossed = res >= 0
        if self.extra.any():  # summed slot by slot: a flow's trunks in the order above
            latency = latency + np.where(crossed, self.extra[res], 0.0).sum(axis=0)
        if (cap <= 0).any():
            dead = int(np.flatnonzero(cap <= 0)[0])
            raise UnavailableError(
                f"no live UB plane between ranks {int(src[dead])} and {int(dst[dead])}"
            )
        w = crossed.astype(np.float64)
        for kept in (cap, latency, res, w):  # shared by every batch between these pairs
            kept.flags.writeable = False
        return PairRoutes(flow_cap=cap, latency_s=latency, crossings=Crossings(res, w))


@dataclass(frozen=True, kw_only=True)
class PairRoutes:
    """The routes of a set of (source, destination) pairs, as FlowBatch takes them."""

    flow_cap: FloatArray
    latency_s: FloatArray
    crossings: Crossings


def _moving(phase: Phase) -> tuple[IntArray, IntArray, FloatArray]:
    """The phase's flows of more than 0 bytes (all of them, as they are, in a mesh)."""
    keep = phase.nbytes > 0
    if keep.all():
        return phase.src, phase.dst, phase.nbytes
    return phase.src[keep], phase.dst[keep], phase.nbytes[keep]


def _same(a: IntArray, b: IntArray) -> bool:
    return a is b or np.array_equal(a, b)


def _distinct(rows: FloatArray) -> tuple[FloatArray, IntArray]:
    """The distinct rows of a matrix, and for each row the index of its distinct row."""
    distinct, of = np.unique(rows, axis=0, return_inverse=True)
    return distinct, of.ravel().astype(np.int64)


def _check_memory(phase: Phase, n: int, die_bytes: int) -> None:
    """What one rank sends or receives in a phase must fit in a die's HBM (its buffers live
    there): a larger collective is OUT_OF_RANGE before anything is timed."""
    for ends, role in ((phase.dst, "receive"), (phase.src, "send")):
        per_rank = weighted_sum(ends, phase.nbytes, n)
        if per_rank.size and not float(per_rank.max()) <= die_bytes:
            raise OutOfRangeError(
                f"a rank would {role} {float(per_rank.max()):.4g} bytes in one phase, more than"
                f" a die's {die_bytes} bytes of HBM",
                reason="TRANSFER_TOO_LARGE",
            )


Flows = tuple[IntArray, IntArray, FloatArray, FloatArray, FloatArray]  # src, dst, bytes, done, GB/s


def _joined(parts: list[Flows]) -> Flows:
    """The phases' per-flow arrays end to end; one phase's (a mesh) as they are, not copied (the
    pairs' are the read-only ones every phase over these ranks shares)."""
    if len(parts) == 1:
        return parts[0]
    src, dst, nbytes, complete, gb_s = (np.concatenate(a) for a in zip(*parts, strict=True))
    return src, dst, nbytes, complete, gb_s


def run_collective(
    graph: LinkGraph, ranks: list[Endpoint], spec: CollectiveSpec
) -> CollectiveTiming:
    algorithm = ALGORITHMS.get(spec.op)
    if algorithm is None:
        raise InvalidArgumentError(
            f"unknown collective {spec.op!r}; known: {', '.join(ALGORITHMS)}"
        )
    profile = graph.profile
    if algorithm.moe is not None:
        spec = replace(
            spec,
            top_k=spec.top_k or profile.moe.top_k,
            bytes_per_token=spec.bytes_per_token or moe_bytes_per_token(algorithm.moe, profile),
        )
    phases = algorithm.phases(len(ranks), spec)
    flows = sum(len(p.src) for p in phases)
    if flows > profile.limits.collective_max_flows:
        raise InvalidArgumentError(
            f"{flows} flows exceed the limit of {profile.limits.collective_max_flows}"
        )
    for phase in phases:
        _check_memory(phase, len(ranks), profile.npu.hbm_bytes_per_die)
    routes = graph.memo(
        ("collective routes", tuple(e.name for e in ranks)), lambda: DieFlows(graph, ranks)
    )
    caps = graph.trunk_cap()
    start = 0.0
    res_bytes = np.zeros(len(caps))
    parts: list[Flows] = []
    for phase in phases:
        batch = routes.batch(phase)
        if batch.size == 0:
            continue
        result = simulate(batch, caps)
        src, dst, _ = _moving(phase)
        gb_s = np.maximum(result.fluid_end_s, 1e-30)  # (in place: 100,000 flows in EP320)
        np.divide(np.divide(batch.nbytes, gb_s, out=gb_s), 1e9, out=gb_s)
        complete = result.complete_s
        took = float(complete.max())
        complete += start  # (from the collective's start)
        parts.append((src, dst, batch.nbytes, complete, gb_s))
        start += took
        res_bytes += result.res_bytes
    if not parts:
        raise InvalidArgumentError("the collective moves no bytes")
    overhead = (
        moe_overhead_s(algorithm.moe, profile, ranks=len(ranks))
        if algorithm.moe
        else profile.moe.collective_launch_s
    )
    check_duration(start + overhead, f"the {spec.op}", profile)
    src, dst, nbytes, complete, gb_s = _joined(parts)
    return CollectiveTiming(
        phases=len(parts),
        flows=len(src),
        total_bytes=float(nbytes.sum()),
        transfer_s=start,
        overhead_s=overhead,
        flow_src=src,
        flow_dst=dst,
        flow_bytes=nbytes,
        flow_complete_s=complete,
        flow_gb_s=gb_s,
        res_bytes=res_bytes,
    )


def moe_ranks(graph: LinkGraph, ranks: int) -> list[Endpoint]:
    """The first `ranks` NPU dies of the topology, node by node: an expert-parallel group as the
    calibration points were measured on (EP8: 4 NPUs of one node; EP256: 16 whole nodes)."""
    dies = [e for e in graph.endpoints.values() if e.device.kind is DeviceKind.NPU]
    if ranks > len(dies):
        raise OutOfRangeError(f"EP{ranks} needs {ranks} NPU dies; the topology has {len(dies)}")
    return dies[:ranks]


def fit_moe_overhead(graph: LinkGraph) -> dict[str, tuple[float, float]]:
    """Refit the MoE software overhead to the published points on this link graph: per op,
    (base, per peer) such that transfer + base + per_peer * (ranks - 1) is each measured time.
    The profile holds the result (MoeCalibration.*_overhead_*_s); this shows where it came from."""
    profile = graph.profile
    left: dict[str, list[tuple[int, float]]] = {}
    for op, ranks, measured in moe_points(profile):
        spec = CollectiveSpec(op=f"moe-{op}", tokens_per_rank=profile.moe.tokens_per_rank)
        timing = run_collective(graph, moe_ranks(graph, ranks), spec)
        left.setdefault(op, []).append((ranks - 1, measured - timing.transfer_s))
    fit = {}
    for op, ((p1, o1), (p2, o2)) in left.items():
        per_peer = (o2 - o1) / (p2 - p1)
        fit[op] = (o1 - per_peer * p1, per_peer)
    return fit
