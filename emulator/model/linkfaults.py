"""Fabric fault kinds, registered by name in one table (as Toxiproxy registers its toxics).

A kind is a small class: it checks its own settings and applies itself to the link graph. What
every fault shares (an id, a target, validation of names, re-applying all faults from a clean
graph whenever one is added or cleared) belongs to `FaultSet`, never to a kind.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.faults.catalogue import FABRIC_PARAMS
from cmemu.emulator.model.faults.params import params_from, unknown_kind
from cmemu.emulator.model.naming import Tier, die_id, l1_switch_id, parse_node, parse_switch
from cmemu.emulator.model.topology import DeviceKind, LinkKind

if TYPE_CHECKING:  # a fault record needs no numpy: a device process imports this module
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    kind: str
    target: str = ""
    factor: float = 0.0
    added_latency_s: float = 0.0
    side_a: tuple[str, ...] = ()
    side_b: tuple[str, ...] = ()
    id: str = ""
    period_s: float = 0.0  # link-flap: one down+up cycle, emulated
    duty: float = 0.0  # link-flap: share of the period down
    since_s: float = 0.0  # emulated instant it was added (a flap's phase counts from it)
    for_s: float = 0.0  # emulated seconds until the fabric clears it; 0: until cleared
    down: bool = False  # link-flap: in the down part of its cycle now (FaultSet.flap)
    loss_rate: float = 0.0  # link-loss: share of frames lost or failing CRC
    module: int = 0  # optical-module: which uplink module of the L1 chip (target)
    one_way: bool = False  # partition: side_a's frames to side_b lost, side_b's to side_a not

    @property
    def until_s(self) -> float:
        return self.since_s + self.for_s if self.for_s else 0.0


def _factor(s: FaultSpec) -> dict[str, object]:
    return {"factor": s.factor}


PARAMS_OF: dict[str, Callable[[FaultSpec], dict[str, object]]] = {
    "link-degraded": _factor,
    "ports-degraded": _factor,
    "rank-slow": _factor,
    "link-latency": lambda s: {"latency_us": s.added_latency_s * 1e6},
    "link-flap": lambda s: {"period_s": s.period_s, "duty": s.duty},
    "partition": lambda s: {
        "side_a": ",".join(s.side_a),
        "side_b": ",".join(s.side_b),
        "one_way": s.one_way,
    },
    "link-loss": lambda s: {"rate": s.loss_rate},
    "optical-module": lambda s: {"module": s.module},
}
"""A spec's parameters by the names of its kind's params dataclass (others take none)."""


def spec_params(spec: FaultSpec) -> Any | None:
    """The typed parameters of a spec of a known kind (None for another), checked as the
    catalogue's dataclass states them: the one place a fabric fault's ranges are checked."""
    cls = FABRIC_PARAMS.get(spec.kind)
    if cls is None:
        return None
    raw = PARAMS_OF[spec.kind](spec) if spec.kind in PARAMS_OF else {}
    return params_from(cls, raw, kind=spec.kind)


class FaultKind(Protocol):
    @property
    def name(self) -> str: ...

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None: ...

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None: ...


class LinkDown:
    name = "link-down"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.up[list(graph.physical(spec.target))] = False


class LinkDegraded:
    name = "link-degraded"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.factor[list(graph.physical(spec.target))] *= spec.factor


class LinkLatency:
    name = "link-latency"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.extra_latency_s[list(graph.physical(spec.target))] += spec.added_latency_s


class SwitchDown:
    name = "switch-down"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.switch_links(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.up[graph.switch_links(spec.target)] = False


class Partition:
    name = "partition"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        if not spec.side_a or not spec.side_b:
            raise InvalidArgumentError("a partition needs devices on both sides (side_a, side_b)")
        for device in (*spec.side_a, *spec.side_b):
            graph.topology.device(device)
        both = set(spec.side_a) & set(spec.side_b)
        if both:
            raise InvalidArgumentError(f"devices on both sides of a partition: {sorted(both)}")

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.partitions.append((frozenset(spec.side_a), frozenset(spec.side_b), spec.one_way))


class LinkFlap:
    """A link toggling: down for duty*period_s, up for the rest, from when it was added."""

    name = "link-flap"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        if spec.down:
            graph.up[list(graph.physical(spec.target))] = False


class LinkLoss:
    """Frames lost or failing CRC at `loss_rate` p, each resent by link-layer retry.

    Model: selective-repeat ARQ with independent losses (Bertsekas & Gallager, Data Networks,
    2nd ed., sec. 2.4): a frame crosses 1/(1-p) times on average, so the link's goodput is
    C(1-p), and each crossing waits p/(1-p) replay round trips on average
    (`switch.link_retry_s`, assumed). A go-back-N replay buffer loses more (every frame in
    flight behind the lost one is resent): this is the optimistic bound."""

    name = "link-loss"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        links = list(graph.physical(spec.target))
        p = spec.loss_rate
        graph.factor[links] *= 1 - p
        graph.extra_latency_s[links] += graph.profile.switch.link_retry_s * p / (1 - p)


def optical_module_links(graph: LinkGraph, switch_id: str, module: int) -> list[int]:
    """Both directions of the uplinks one optical module of an L1 chip carries: the chip's
    links to the L2 chips of its sub-plane, `uplinks_per_optical_module` to a module, in L2
    chip order."""
    links = graph.switch_links(switch_id)
    uplinks = [i for i in links if graph.kinds[i] is LinkKind.L1_L2]
    if not uplinks or parse_switch(switch_id).tier is not Tier.L1:
        raise InvalidArgumentError(
            f"{quote(switch_id)} has no uplinks: an optical module is an L1 chip's (n00-l1s3)",
            field="target",
            subject=switch_id,
        )
    per = graph.profile.switch.uplinks_per_optical_module * 2  # both directions of each link
    modules = -(-len(uplinks) // per)
    if not 0 <= module < modules:
        raise InvalidArgumentError(
            f"{switch_id} has optical modules 0 to {modules - 1}, not {module}",
            field="params.module",
            subject=switch_id,
        )
    return uplinks[module * per : (module + 1) * per]


class OpticalModule:
    """An optical module of an L1 chip fails: the bundle of uplinks it carries to the L2 tier
    goes down at once (one fault, cleared as one); the chip's links inside the node stay up."""

    name = "optical-module"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        optical_module_links(graph, spec.target, spec.module)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.up[optical_module_links(graph, spec.target, spec.module)] = False


def l1_board_links(graph: LinkGraph, node: str) -> list[int]:
    """Both directions of every link of a node's L1 chips: what its L1 switch board carries."""
    try:
        parse_node(node)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{exc}: an L1 board is a node's (n03)", field="target", subject=node
        ) from None
    if node not in graph.topology.nodes:
        raise NotFoundError(
            f"no node {quote(node)} (nodes: {', '.join(graph.topology.nodes[:4])}...)",
            subject=node,
            reason="NODE_NOT_FOUND",
        )
    chips = range(graph.profile.node.l1_chips)
    return [i for chip in chips for i in graph.switch_links(l1_switch_id(node, chip))]


class L1Board:
    """A node's L1 switch board fails (its power, its controller): the node's L1 chips and
    every link of theirs go down at once, one fault cleared as one. Its NPUs and CPUs stay up
    and answer their callers, but are cut off the unified bus, each other included (traffic
    inside a node crosses the L1 chips too): every transfer to or from them finds no route."""

    name = "l1-board"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        l1_board_links(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.up[l1_board_links(graph, spec.target)] = False


def flap_down(spec: FaultSpec, now_s: float) -> bool:
    """Whether a flapping link is in the down part of its cycle at `now_s`."""
    phase = (now_s - spec.since_s) % spec.period_s
    return phase < spec.duty * spec.period_s


def next_flip_s(spec: FaultSpec, now_s: float) -> float:
    """The emulated instant after `now_s` at which a flapping link next changes state."""
    cycle = math.floor((now_s - spec.since_s) / spec.period_s)
    start = spec.since_s + cycle * spec.period_s
    for edge in (start + spec.duty * spec.period_s, start + spec.period_s):
        if edge > now_s:
            return edge
    return start + spec.period_s + spec.duty * spec.period_s


def _device_ports(graph: LinkGraph, target: str) -> list[int]:
    """Every directed port link of a device (both dies of an NPU) or of one die."""
    names = [target]
    device = graph.topology.device(target) if "." not in target else None
    if device is not None and device.kind is DeviceKind.NPU:
        names = [die_id(device.id, d) for d in range(graph.profile.npu.dies)]
    links: list[int] = []
    for name in names:
        endpoint = graph.endpoint(name)
        for table in (endpoint.out_ports, endpoint.in_ports):
            links.extend(i for plane in table for i in plane)
    return links


class PortsDegraded:
    """A slow device: its own UB ports keep `factor` of their bandwidth."""

    name = "ports-degraded"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        _device_ports(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.factor[_device_ports(graph, spec.target)] *= spec.factor


def _rank_target(graph: LinkGraph, target: str) -> None:
    """An NPU or one of its dies: what a collective ranks."""
    if "." in target:
        graph.endpoint(target)
        return
    device = graph.topology.device(target)
    if device.kind is not DeviceKind.NPU:
        raise InvalidArgumentError(
            f"{quote(target)} is a {device.kind.value}: collectives rank NPUs and their dies",
            subject=target,
        )


class RankDown:
    """A dead rank (its device crashed, powered off or went down, or one die failed): every
    collective it is part of fails at once, as a real one does when a rank's links drop. Routes
    are left alone: a UB transfer reaches the device, which refuses it itself. Set by the
    device's own fault (engines/device/kinds/) and cleared with it."""

    name = "rank-down"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        _rank_target(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        pass  # FaultSet.ranks reads it; the link graph is untouched


class RankHung(RankDown):
    """A hung rank: a collective it is part of never completes while it lasts (the caller's
    deadline ends the wait), and carries on when it clears."""

    name = "rank-hung"


class RankSlow(RankDown):
    """A slowed rank: it computes at `factor` of its speed. The collectives it is part of wait
    for it (their per-phase software overhead, run on every rank, stretches by 1/factor) and
    report the slowest rank's share, so that a caller costs the compute between them at the
    straggler's pace (a synchronous step runs at its slowest member's)."""

    name = "rank-slow"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        _rank_target(graph, spec.target)


RANK_KINDS = (RankDown.name, RankHung.name, RankSlow.name)


@dataclass(frozen=True)
class RankState:
    """What the rank faults say of a set of ranks: the first dead one, the first hung one, and
    the slowest one's compute share (1.0: none slowed)."""

    down: str | None = None
    hung: str | None = None
    compute_share: float = 1.0
    slowed: Mapping[str, float] = field(default_factory=dict)  # each slowed rank's share


FAULT_KINDS: dict[str, FaultKind] = {
    kind.name: kind()
    for kind in (
        LinkDown,
        LinkDegraded,
        LinkLatency,
        SwitchDown,
        Partition,
        LinkFlap,
        LinkLoss,
        OpticalModule,
        L1Board,
        PortsDegraded,
        RankDown,
        RankHung,
        RankSlow,
    )
}


@dataclass
class FaultSet:
    """The active faults of one fabric; the graph always equals a clean graph plus all of them."""

    graph: LinkGraph
    faults: dict[str, FaultSpec] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, spec: FaultSpec) -> FaultSpec:
        kind = FAULT_KINDS.get(spec.kind)
        if kind is None:
            raise unknown_kind(spec.kind, FAULT_KINDS)
        spec_params(spec)
        kind.validate(self.graph, spec)
        if not (math.isfinite(spec.for_s) and spec.for_s >= 0):
            raise InvalidArgumentError(
                f"for_s must be >= 0 (0: until cleared), got {spec.for_s}", field="for_s"
            )
        stored = replace(spec, id=f"f{next(self._ids)}")
        if stored.kind == LinkFlap.name:
            stored = replace(stored, down=flap_down(stored, stored.since_s))
        self.faults[stored.id] = stored
        self._reapply()
        return stored

    def clear(self, fault_id: str = "", *, all: bool = False) -> None:
        """Clear one fault by id, or every fault with all=True (never by an empty id)."""
        if fault_id and all:
            raise InvalidArgumentError(
                "name one fault (id) or all, not both", field="all", subject=fault_id
            )
        if not fault_id and not all:
            raise InvalidArgumentError(
                "id is required (clearing every fault takes all=true)", field="id"
            )
        if fault_id and fault_id not in self.faults:
            raise NotFoundError(
                f"no fault {quote(fault_id)}; active: {', '.join(self.faults) or 'none'}",
                field="id",
                subject=fault_id,
                reason="FAULT_NOT_FOUND",
            )
        if fault_id:
            del self.faults[fault_id]
        else:
            self.faults.clear()
        self._reapply()

    def flap(self, now_s: float) -> list[FaultSpec]:
        """Bring every flapping link to its state at `now_s`; the faults that changed."""
        changed = []
        for fault_id, spec in self.faults.items():
            if spec.kind == LinkFlap.name and flap_down(spec, now_s) != spec.down:
                self.faults[fault_id] = replace(spec, down=not spec.down)
                changed.append(self.faults[fault_id])
        if changed:
            self._reapply()
        return changed

    def expired(self, now_s: float) -> list[str]:
        """The faults whose duration has run out at `now_s`."""
        return [i for i, f in self.faults.items() if f.for_s and f.until_s <= now_s]

    def next_change_s(self, now_s: float) -> float | None:
        """The next emulated instant a fault flips or expires, if any."""
        times = [f.until_s for f in self.faults.values() if f.for_s]
        times += [next_flip_s(f, now_s) for f in self.faults.values() if f.kind == LinkFlap.name]
        return min(times, default=None)

    def ranks(self, names: Iterable[str]) -> RankState:
        """The rank faults on `names` (NPU dies "n00-npu3.d1"): a fault on an NPU covers both
        of its dies. Cheap when there are none (every collective asks)."""
        faults = [f for f in self.faults.values() if f.kind in RANK_KINDS]
        if not faults:
            return RankState()
        down: str | None = None
        hung: str | None = None
        share = 1.0
        slowed: dict[str, float] = {}
        for name in names:
            device = name.split(".", 1)[0]
            for f in faults:
                if f.target not in (name, device):
                    continue
                if f.kind == RankDown.name and down is None:
                    down = name
                elif f.kind == RankHung.name and hung is None:
                    hung = name
                elif f.kind == RankSlow.name:
                    share = min(share, f.factor)
                    slowed[name] = min(slowed.get(name, 1.0), f.factor)
        return RankState(down=down, hung=hung, compute_share=share, slowed=slowed)

    def _reapply(self) -> None:
        self.graph.reset()
        for spec in self.faults.values():
            FAULT_KINDS[spec.kind].apply(self.graph, spec)
        self.graph.invalidate()
