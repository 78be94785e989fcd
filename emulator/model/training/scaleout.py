"""Data-parallel training over N supernodes joined by the RDMA plane, and its linearity.

The step of one supernode is the existing model's (timing.ModelTimer: compute, the MoE
all-to-alls and the in-supernode collectives, timed on the UB link graph); what N supernodes
add is the gradient all-reduce across them. It is hierarchical, as libraries do it over two
planes: per gradient bucket,

1. reduce-scatter inside the supernode over UB (each of the `dp` data-parallel dies of a
   supernode ends with a 1/dp shard of the bucket reduced over its supernode);
2. all-reduce of each shard across the N supernodes over the RDMA plane: die k of every
   supernode with die k of every other one, all dies at once, each through its own port;
3. all-gather inside the supernode over UB.

Steps 1 and 3 are the existing collectives on the UB link graph. Step 2 is a closed form per
algorithm (432 supernodes x 768 dies cannot be simulated flow by flow): `steps x latency +
bytes / rate`, where the rate is what a die gets when every die of the plane sends at once, the
least of its port and its share of the leaf and core tiers after their oversubscription, at the
plane's RoCE efficiency (protocol overhead on every link). The algorithm is chosen by size, as
HCCL and NCCL choose by their cost models: a ring (bandwidth-optimal, 2(N-1) latencies) or
recursive halving-doubling (Rabenseifner: the same bytes, 2 log2 N latencies; a non-power-of-two
N folds the extra ranks in and out). `time_cross_flows` runs the same algorithms flow by flow on
the plane's links of a `build_cluster` document with flowsim.simulate, which the tests use to
validate the closed form at 2, 3 and 4 supernodes.

Overlap: gradient buckets become ready one after another during the last micro-batch's backward
pass (evenly spread over it); each bucket's all-reduce starts when it is ready and the previous
one has finished (one collective at a time, as a framework's communication stream runs them).
What sticks out past the backward pass is exposed. Left out, and said here rather than hidden:
contention of the overlapped all-reduce with the backward pass's own UB traffic and HBM; routing
is ideal spraying over every spine and core (adaptive routing; no ECMP hash collisions); the
step model's own simplifications (step.py) hold.

Linearity(N) = throughput(N) / (N x throughput(1)): every die keeps its batch (weak scaling), so
it is step(1) / step(N).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.flowsim import FlowBatch, simulate
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import parse_id
from cmemu.emulator.model.presets import Preset, get_preset
from cmemu.emulator.model.scaleout import leaf_spine_bytes_per_s, spine_core_bytes_per_s
from cmemu.emulator.model.topology import DeviceKind, LinkKind, Topology, build
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.step import gradient_buckets, groups
from cmemu.emulator.model.training.timing import ModelTimer, first_dies

CROSS_SWITCHES = 5  # die -> leaf -> spine -> core -> spine -> leaf -> die


# --- the cross-supernode all-reduce: closed forms --------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CrossCost:
    """One cross-supernode all-reduce of `shard` bytes per die, by one algorithm."""

    algorithm: str
    steps: int  # message rounds, each paying the plane's one-way latency
    bytes_per_die: float  # what each die sends (and receives)
    seconds: float


def _ring(n: int, shard: float) -> tuple[int, float]:
    """Reduce-scatter then all-gather around a ring: 2(N-1) rounds of shard/N each."""
    return 2 * (n - 1), 2 * (n - 1) * shard / n


def _halving_doubling(n: int, shard: float) -> tuple[int, float]:
    """Recursive halving (reduce-scatter) then doubling (all-gather) over the largest power of
    two p <= N: 2 log2 p rounds moving 2(p-1)/p of the shard. The N - p extra ranks first hand
    their whole shard to a partner and get the result back at the end: two more full rounds."""
    p = 1 << (n.bit_length() - 1)
    steps, sent = 2 * (p.bit_length() - 1), 2 * (p - 1) * shard / p
    if n > p:
        steps, sent = steps + 2, sent + 2 * shard
    return steps, sent


CROSS_ALGORITHMS: dict[str, Callable[[int, float], tuple[int, float]]] = {
    "ring": _ring,
    "halving-doubling": _halving_doubling,
}


def cross_die_bytes_per_s(nodes: int, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """A die's rate across supernodes when every die of the plane sends at once: its port, or
    its share of its leaf's uplinks, or of its spines' uplinks to the core (the per-link
    capacities of emulator/model/scaleout.py), whichever is least, at the RoCE efficiency."""
    so, npu = profile.scaleout, profile.npu
    dies_per_node = profile.node.npus * npu.dies
    port = npu.rdma_bytes_per_s_per_die
    leaf = so.spines_per_supernode * leaf_spine_bytes_per_s(profile) / dies_per_node
    core = (
        so.spines_per_supernode
        * so.core_switches
        * spine_core_bytes_per_s(nodes, profile)
        / (nodes * dies_per_node)
    )
    return min(port, leaf, core) * so.efficiency


def cross_allreduce(
    supernodes: int,
    shard: float,
    *,
    nodes: int,
    algorithm: str | None = None,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> CrossCost:
    """The cross-supernode all-reduce of `shard` bytes per die: the named algorithm, or the
    cheapest (None). Zero with one supernode."""
    names = [algorithm] if algorithm else list(CROSS_ALGORITHMS)
    unknown = [a for a in names if a not in CROSS_ALGORITHMS]
    if unknown:
        raise InvalidArgumentError(
            f"unknown cross-supernode algorithm {unknown[0]!r}; known: "
            + ", ".join(CROSS_ALGORITHMS),
            field="algorithm",
        )
    if supernodes < 2 or shard <= 0:
        return CrossCost(algorithm=names[0], steps=0, bytes_per_die=0.0, seconds=0.0)
    rate = cross_die_bytes_per_s(nodes, profile)
    hop = profile.scaleout.latency_s(CROSS_SWITCHES)
    launch = profile.moe.collective_launch_s
    costs = []
    for name in names:
        steps, sent = CROSS_ALGORITHMS[name](supernodes, shard)
        seconds = launch + steps * hop + sent / rate
        costs.append(CrossCost(algorithm=name, steps=steps, bytes_per_die=sent, seconds=seconds))
    return min(costs, key=lambda c: c.seconds)


# --- the same algorithms flow by flow, on a build_cluster document's plane ---------------------

Round = list[tuple[int, int, float]]  # (source supernode, destination supernode, bytes per die)


def _ring_rounds(n: int, shard: float) -> list[Round]:
    one = [(s, (s + 1) % n, shard / n) for s in range(n)]
    return [one] * (2 * (n - 1))


def _halving_doubling_rounds(n: int, shard: float) -> list[Round]:
    p = 1 << (n.bit_length() - 1)
    extra = list(range(p, n))
    fold_in = [[(e, e - p, shard) for e in extra]] if extra else []
    fold_out = [[(e - p, e, shard) for e in extra]] if extra else []
    halving = [
        [(s, s ^ bit, shard * bit / p) for s in range(p)]
        for bit in (1 << k for k in reversed(range(p.bit_length() - 1)))
    ]
    return fold_in + halving + halving[::-1] + fold_out


ROUNDS: dict[str, Callable[[int, float], list[Round]]] = {
    "ring": _ring_rounds,
    "halving-doubling": _halving_doubling_rounds,
}


@dataclass(frozen=True, kw_only=True)
class FlowTiming:
    seconds: float
    rounds: int
    flows: int


class PlaneRoutes:
    """The plane of a `build_cluster` document as flowsim resources: every link twice (one per
    direction, full duplex) at its capacity times the RoCE efficiency. A flow from a die of one
    supernode to a die of another crosses the source's port and leaf uplinks, its spines' core
    uplinks, the destination's spines' core downlinks, leaf downlinks and port, sprayed evenly
    over every spine and core switch (weights)."""

    def __init__(self, topology: Topology, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        plane = topology.scaleout
        if plane is None:
            raise InvalidArgumentError(f"{topology.preset} has no scale-out plane")
        self.profile = profile
        self.supernodes = plane.supernodes
        index: dict[tuple[str, str], int] = {}
        caps: list[float] = []
        for link in plane.links:
            for a, b in ((link.a, link.b), (link.b, link.a)):
                index[(a, b)] = len(caps)
                caps.append(link.bytes_per_s * profile.scaleout.efficiency)
        self.index = index
        self.caps = np.array(caps)
        ports = [link for link in plane.links if link.kind is LinkKind.RDMA_PORT]
        self.leaf_of = {link.a: link.b for link in ports}
        self.spines: dict[int, list[str]] = {}
        self.cores: list[str] = sorted(
            {link.b for link in plane.links if link.kind is LinkKind.SPINE_CORE}
        )
        for link in plane.links:
            if link.kind is LinkKind.SPINE_CORE and link.b == self.cores[0]:
                self.spines.setdefault(parse_id(link.a).supernode, []).append(link.a)
        self.dies: dict[int, list[str]] = {}
        for die in self.leaf_of:
            self.dies.setdefault(parse_id(die).supernode, []).append(die)

    def path(self, src: str, dst: str) -> list[tuple[int, float]]:
        """(resource, weight) of a flow between dies of two different supernodes."""
        s, d = parse_id(src).supernode, parse_id(dst).supernode
        up, down = self.spines[s], self.spines[d]
        leaf_s, leaf_d = self.leaf_of[src], self.leaf_of[dst]
        per_core = 1.0 / (len(up) * len(self.cores))
        hops = [(self.index[(src, leaf_s)], 1.0), (self.index[(leaf_d, dst)], 1.0)]
        hops += [(self.index[(leaf_s, sp)], 1.0 / len(up)) for sp in up]
        hops += [(self.index[(sp, leaf_d)], 1.0 / len(down)) for sp in down]
        hops += [(self.index[(sp, c)], per_core) for sp in up for c in self.cores]
        hops += [(self.index[(c, sp)], per_core) for sp in down for c in self.cores]
        return hops

    def time_round(self, flows: Round) -> float:
        """Every die of each source supernode sends to the same die of its destination, at once."""
        inc_flow: list[int] = []
        inc_res: list[int] = []
        inc_w: list[float] = []
        nbytes: list[float] = []
        for s, d, size in flows:
            for a, b in zip(self.dies[s], self.dies[d], strict=True):
                for res, w in self.path(a, b):
                    inc_flow.append(len(nbytes))
                    inc_res.append(res)
                    inc_w.append(w)
                nbytes.append(size)
        n = len(nbytes)
        port = self.profile.npu.rdma_bytes_per_s_per_die * self.profile.scaleout.efficiency
        batch = FlowBatch(
            inc_flow=np.array(inc_flow, dtype=np.int64),
            inc_res=np.array(inc_res, dtype=np.int64),
            inc_w=np.array(inc_w),
            flow_cap=np.full(n, port),
            nbytes=np.array(nbytes),
            latency_s=np.full(n, self.profile.scaleout.latency_s(CROSS_SWITCHES)),
        )
        return float(simulate(batch, self.caps).complete_s.max())


def time_cross_flows(
    topology: Topology, shard: float, algorithm: str, profile: HardwareProfile = DEFAULT_PROFILE
) -> FlowTiming:
    """The cross-supernode all-reduce of `shard` bytes per die over the plane of a
    `build_cluster` document, round by round on flowsim (what the closed form claims to be)."""
    routes = PlaneRoutes(topology, profile)
    rounds = ROUNDS[algorithm](routes.supernodes, shard)
    seconds = sum(routes.time_round(r) for r in rounds)
    flows = sum(len(routes.dies[s]) for r in rounds for s, _, _ in r)
    return FlowTiming(
        seconds=seconds + profile.moe.collective_launch_s, rounds=len(rounds), flows=flows
    )


# --- the step over N supernodes ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SupernodeStep:
    """What one supernode's step costs, independent of N: measured once, reused for every N."""

    preset: str  # the base supernode
    nodes: int
    npus: int
    dp: int  # data-parallel dies inside one supernode (one per expert-parallel group)
    expert_parallel: int
    tokens: int  # trained per step, over the supernode's dies
    compute_s: float  # forward + backward of every micro-batch, with their all-to-alls
    backward_s: float  # the last micro-batch's backward pass: the window buckets overlap
    buckets: int
    bucket_bytes: int
    allreduce_bucket_s: float  # one bucket's all-reduce inside the supernode (N = 1)
    reduce_scatter_s: float  # one bucket's reduce-scatter inside (hierarchical, N > 1)
    all_gather_s: float  # and all-gather


@dataclass(frozen=True, kw_only=True)
class ScaleOutStep:
    supernodes: int
    npus: int
    algorithm: str  # cross-supernode; "" with one supernode
    compute_s: float
    bucket_s: float  # one bucket's whole all-reduce
    reduce_scatter_s: float  # per bucket, inside (0 with one supernode: a flat all-reduce)
    cross_s: float  # per bucket, across supernodes
    all_gather_s: float  # per bucket, inside
    allreduce_s: float  # every bucket, back to back
    exposed_s: float  # what the step waits for past the backward pass
    step_s: float
    step_one_s: float  # the same job's step on one supernode
    tokens_per_s: float  # over every die of every supernode
    linearity: float  # step(1) / step(N)


def supernode_step(
    preset: str,
    *,
    expert_parallel: int = 0,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> SupernodeStep:
    """The step of a job on every NPU of one supernode of `preset` (its base, for `<base>xN`),
    timed by the existing model on its UB link graph."""
    spec = get_preset(preset)
    base = get_preset(spec.base) if spec.base else spec
    topology = build(base, profile=profile)
    npus = sum(1 for d in topology.devices if d.kind is DeviceKind.NPU)
    shape = shape_of(name="scaleout", npus=npus, expert_parallel=expert_parallel, profile=profile)
    timer = ModelTimer(topology, profile)
    dies = first_dies(topology, npus, profile)
    step = timer.step(shape, dies)
    dp_group = groups(dies, shape).data_parallel
    # Across N > 1 supernodes the job has dp x N >= 2 data-parallel ranks, so its gradients are
    # bucketed even when one supernode holds a single rank (gradient_buckets only asks for >= 2).
    whole = dataclasses.replace(shape, data_parallel=max(2, shape.data_parallel))
    buckets = gradient_buckets(whole, profile)
    dp = len(dp_group)
    return SupernodeStep(
        preset=base.name,
        nodes=len(topology.nodes),
        npus=npus,
        dp=dp,
        expert_parallel=shape.expert_parallel,
        tokens=shape.dies * shape.micro_batches * profile.training.tokens_per_die,
        compute_s=step.compute_s,
        backward_s=step.compute_s / shape.micro_batches - step.forward_s,
        buckets=buckets.count,
        bucket_bytes=buckets.bytes,
        allreduce_bucket_s=timer.collective_s("all-reduce", dp_group, buckets.bytes),
        reduce_scatter_s=timer.collective_s("reduce-scatter", dp_group, buckets.bytes),
        all_gather_s=timer.collective_s("all-gather", dp_group, math.ceil(buckets.bytes / dp)),
    )


def exposed_allreduce_s(
    buckets: int, bucket_s: float, backward_s: float, *, overlap: bool
) -> float:
    """The all-reduce time the step waits for. Overlapped: bucket i of B is ready at i/B of the
    backward pass and starts when ready and the one before it is done, so the last finishes at
    max over i of (ready_i + (B - i + 1) x bucket): the first or the last bucket's bound."""
    if buckets == 0:
        return 0.0
    if not overlap:
        return buckets * bucket_s
    finish = max(backward_s / buckets + buckets * bucket_s, backward_s + bucket_s)
    return finish - backward_s


def scaleout_step(
    base: SupernodeStep,
    supernodes: int,
    *,
    overlap: bool = True,
    algorithm: str | None = None,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> ScaleOutStep:
    """The step of the same job on `supernodes` supernodes, and its linearity against one."""
    limit = profile.scaleout.max_supernodes
    if not 1 <= supernodes <= limit:
        raise InvalidArgumentError(
            f"supernodes must be 1..{limit} (the scale-out plane joins at most {limit}), "
            f"got {supernodes}",
            field="supernodes",
        )
    single = base.compute_s + exposed_allreduce_s(
        base.buckets, base.allreduce_bucket_s, base.backward_s, overlap=overlap
    )
    if supernodes == 1:
        rs = cross = ag = 0.0
        bucket, name = base.allreduce_bucket_s, ""
    else:
        cost = cross_allreduce(
            supernodes,
            base.bucket_bytes / base.dp,
            nodes=base.nodes,
            algorithm=algorithm,
            profile=profile,
        )
        rs, cross, ag, name = base.reduce_scatter_s, cost.seconds, base.all_gather_s, cost.algorithm
        bucket = rs + cross + ag
    exposed = exposed_allreduce_s(base.buckets, bucket, base.backward_s, overlap=overlap)
    step = base.compute_s + exposed
    return ScaleOutStep(
        supernodes=supernodes,
        npus=supernodes * base.npus,
        algorithm=name,
        compute_s=base.compute_s,
        bucket_s=bucket,
        reduce_scatter_s=rs,
        cross_s=cross,
        all_gather_s=ag,
        allreduce_s=base.buckets * bucket,
        exposed_s=exposed,
        step_s=step,
        step_one_s=single,
        tokens_per_s=supernodes * base.tokens / step,
        linearity=single / step,
    )


def with_oversubscription(
    profile: HardwareProfile, *, leaf: float | None = None, spine: float | None = None
) -> HardwareProfile:
    """The profile with the plane's leaf and/or spine tier oversubscribed (1.0: non-blocking)."""
    so = profile.scaleout
    for name, value in (("leaf", leaf), ("spine", spine)):
        if value is not None and not (math.isfinite(value) and value >= 1.0):
            raise InvalidArgumentError(
                f"{name} oversubscription must be >= 1 (1: non-blocking), got {value}",
                field="oversubscription",
            )
    return dataclasses.replace(
        profile,
        scaleout=dataclasses.replace(
            so,
            leaf_oversubscription=so.leaf_oversubscription if leaf is None else leaf,
            spine_oversubscription=so.spine_oversubscription if spine is None else spine,
        ),
    )


def preset_supernodes(preset: str, profile: HardwareProfile = DEFAULT_PROFILE) -> Preset:
    """A preset by name, its supernode count checked against the plane's limit (a plain base
    preset is one supernode)."""
    spec = get_preset(preset)
    limit = profile.scaleout.max_supernodes
    if spec.supernodes > limit:
        raise InvalidArgumentError(
            f"preset {spec.name}: {spec.supernodes} supernodes exceed the {limit} the scale-out "
            "plane joins",
            field="preset",
        )
    return spec
