"""The RDMA scale-out plane as a link graph: directed links, ECMP routes, capacities after faults.

Every physical link of `Topology.scaleout` becomes two directed links (RoCE ports are full
duplex), each one resource of the live flow simulator (emulator/model/flowsim.py). A route goes
die -> leaf -> spine -> (core -> spine) -> leaf -> die and is spread evenly over every live
path (ECMP over the spines and core switches), so a link's weight in the route is the share of
the live paths that cross it, as the UB link graph spreads a transfer over its planes. A fault
that takes a spine away re-spreads the route over the others; one that leaves no path cuts it.

Capacities are the links' line rates x the profile's RoCE efficiency x each fault's factor; the
latency is both NICs plus the switches crossed (`profile.scaleout.latency_s`).

A partition between two supernodes (`sn0~sn1`) cuts every route between them and no other: the
scale-out plane between them is cut as a misconfigured core ACL or a cut inter-pod trunk would
cut it, while each still reaches the rest.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, UnavailableError, quote
from cmemu.emulator.model.faults import gateway
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import (
    Tier,
    directed_link_id,
    link_id,
    parse_link,
    parse_supernode,
    parse_switch,
    supernode_id,
)
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.model.topology import LinkKind, ScaleOut

FloatArray = npt.NDArray[np.float64]
Incidence = tuple[tuple[int, float], ...]


@dataclass(frozen=True, kw_only=True)
class RdmaRoute:
    resources: Incidence  # (directed link, share of the flow crossing it)
    cap: float  # the flow's own ceiling: its ports, bytes/s
    latency_s: float
    hops: tuple[str, ...]  # die, leaf, spine, core, ..., die (one path of the spread shown)
    switches: int
    paths: int  # live ECMP paths the flow is spread over


@dataclass(frozen=True, kw_only=True)
class _Port:
    leaf: str
    out: int  # die > leaf
    inn: int  # leaf > die


class RdmaGraph:
    """The plane's directed links and their live state; routes between NPU dies."""

    def __init__(self, plane: ScaleOut, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.plane = plane
        self.profile = profile
        self.version = 0
        self.names: list[str] = []
        self.kinds: list[LinkKind] = []
        self._index: dict[str, int] = {}
        self._physical: dict[str, tuple[int, int]] = {}
        self._by_switch: dict[str, list[int]] = defaultdict(list)
        self.ports: dict[str, _Port] = {}
        self._spines: dict[int, list[str]] = defaultdict(list)  # supernode -> spines
        self._cores: list[str] = []
        self.tier: dict[str, Tier] = {}
        raw: list[float] = []
        for sw in plane.switches:
            tier = Tier(sw.tier)
            self.tier[sw.id] = tier
            if tier is Tier.SPINE:
                self._spines[parse_switch(sw.id).supernode].append(sw.id)
            elif tier is Tier.CORE:
                self._cores.append(sw.id)
        for link in plane.links:
            pair = []
            for a, b in ((link.a, link.b), (link.b, link.a)):
                i = len(self.names)
                self.names.append(directed_link_id(a, b))
                self.kinds.append(link.kind)
                self._index[self.names[-1]] = i
                raw.append(link.bytes_per_s)
                for end in (a, b):
                    if end in self.tier:
                        self._by_switch[end].append(i)
                pair.append(i)
            self._physical[link_id(link.a, link.b)] = (pair[0], pair[1])
            if link.kind is LinkKind.RDMA_PORT:
                self.ports[link.a] = _Port(leaf=link.b, out=pair[0], inn=pair[1])
        self.raw = np.array(raw, dtype=np.float64)
        self.up = np.ones(len(raw), dtype=bool)
        self.factor = np.ones(len(raw))
        self.cut: set[frozenset[int]] = set()  # pairs of supernodes partitioned from each other

    # --- live state ----------------------------------------------------------------------------

    def reset(self) -> None:
        self.up[:] = True
        self.factor[:] = 1.0
        self.cut.clear()

    def changed(self) -> None:
        self.version += 1

    def link_cap(self) -> FloatArray:
        """Each directed link's usable rate now: line rate x efficiency x faults (0 if down)."""
        cap: FloatArray = self.raw * self.factor * self.up * self.profile.scaleout.efficiency
        return cap

    def physical(self, link: str) -> tuple[int, int]:
        """Both directions of a plane link "a~b" (either order)."""
        name = parse_link(link)
        found = self._physical.get(link_id(name.a, name.b)) or self._physical.get(
            link_id(name.b, name.a)
        )
        if found is None:
            raise NotFoundError(
                f"no RDMA plane link {quote(link)} (links join a die and its leaf, a leaf and a "
                "spine, a spine and a core switch)",
                field="target",
                subject=link,
                reason="LINK_NOT_FOUND",
            )
        return found

    def switch_links(self, switch: str) -> list[int]:
        links = self._by_switch.get(switch)
        if links is None:
            raise NotFoundError(
                f"no RDMA plane switch {quote(switch)} (leaves n07-leaf, spines spine3, "
                "core switches core5)",
                field="target",
                subject=switch,
                reason="SWITCH_NOT_FOUND",
            )
        return links

    def supernode_pair(self, target: str) -> frozenset[int]:
        """The two supernodes `target` ("sn0~sn1") names, both of this plane."""
        name = parse_link(target)
        pair = [parse_supernode(end) for end in (name.a, name.b)]
        for index in pair:
            if index not in self._spines:
                raise NotFoundError(
                    f"no supernode {supernode_id(index)} on this plane (it joins "
                    f"{', '.join(supernode_id(i) for i in sorted(self._spines))})",
                    field="target",
                    subject=target,
                    reason="SUPERNODE_NOT_FOUND",
                )
        return frozenset(pair)

    def port(self, die: str) -> _Port:
        found = self.ports.get(die)
        if found is None:
            raise NotFoundError(
                f"{quote(die)} has no RDMA port on this plane (NPU dies only)",
                subject=die,
                reason="NO_RDMA_PORT",
            )
        return found

    # --- routes --------------------------------------------------------------------------------

    def route(self, src: str, dst: str) -> RdmaRoute:
        """The route of a flow from die `src` to die `dst`, spread over the live ECMP paths."""
        a, b = self.port(src), self.port(dst)
        cap = self.link_cap()
        ends = (a.out, b.inn)
        ceiling = float(min(cap[a.out], cap[b.inn]))
        if ceiling <= 0:
            raise UnavailableError(
                f"the RDMA port of {src if cap[a.out] <= 0 else dst} is down",
                subject=f"{src}>{dst}",
                reason="ROUTE_CUT",
            )
        if a.leaf == b.leaf:
            return RdmaRoute(
                resources=((a.out, 1.0), (b.inn, 1.0)),
                cap=ceiling,
                latency_s=self.profile.scaleout.latency_s(1),
                hops=(src, a.leaf, dst),
                switches=1,
                paths=1,
            )
        sa, sb = parse_switch(a.leaf).supernode, parse_switch(b.leaf).supernode
        if frozenset((sa, sb)) in self.cut:
            raise UnavailableError(
                f"{supernode_id(min(sa, sb))} and {supernode_id(max(sa, sb))} are partitioned: "
                "the RDMA plane "
                f"between them is cut ({src} to {dst})",
                subject=f"{src}>{dst}",
                reason="ROUTE_CUT",
            )
        paths = self._paths(a.leaf, b.leaf)
        live = [p for p in paths if all(cap[i] > 0 for i in p[1])]
        if not live:
            raise UnavailableError(
                f"no live path of the RDMA plane joins {src} and {dst}",
                subject=f"{src}>{dst}",
                reason="ROUTE_CUT",
            )
        share = 1.0 / len(live)
        weights: dict[int, float] = defaultdict(float)
        for _, links in live:
            for i in links:
                weights[i] += share
        switches = len(live[0][0])
        return RdmaRoute(
            resources=((ends[0], 1.0), *sorted(weights.items()), (ends[1], 1.0)),
            cap=ceiling,
            latency_s=self.profile.scaleout.latency_s(switches),
            hops=(src, *live[0][0], dst),
            switches=switches,
            paths=len(live),
        )

    def _paths(self, src_leaf: str, dst_leaf: str) -> list[tuple[tuple[str, ...], list[int]]]:
        """Every ECMP path between two leaves: its switches and its directed links."""
        ix = self._index
        sa, sb = parse_switch(src_leaf).supernode, parse_switch(dst_leaf).supernode
        if sa == sb:
            return [
                (
                    (src_leaf, s, dst_leaf),
                    [ix[directed_link_id(src_leaf, s)], ix[directed_link_id(s, dst_leaf)]],
                )
                for s in self._spines[sa]
            ]
        return [
            (
                (src_leaf, s, c, t, dst_leaf),
                [
                    ix[directed_link_id(src_leaf, s)],
                    ix[directed_link_id(s, c)],
                    ix[directed_link_id(c, t)],
                    ix[directed_link_id(t, dst_leaf)],
                ],
            )
            for s, c, t in itertools.product(self._spines[sa], self._cores, self._spines[sb])
        ]


# --- faults --------------------------------------------------------------------------------------


@dataclass
class RdmaFaultSet:
    """The plane's active faults; the graph is always a clean plane plus all of them. Each
    kind is one module of emulator/model/faults/gateway/ (its params, effect, help); what every
    fault shares (an id, a duration, checks before it is stored) is here."""

    graph: RdmaGraph
    faults: dict[str, RdmaFault[Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, fault: RdmaFault[Any]) -> RdmaFault[Any]:
        effect = gateway.plane_kind(fault.kind)
        gateway.checked(fault)  # its params: its kind's, in their ranges (a slow kind's factor)
        effect.validate(self.graph, fault)  # its target
        if not (math.isfinite(fault.for_s) and fault.for_s >= 0):
            raise InvalidArgumentError(
                f"for_s must be >= 0 (0: until cleared), got {fault.for_s}", field="for_s"
            )
        stored = replace(fault, id=f"r{next(self._ids)}")
        self.faults[stored.id] = stored
        self._reapply()
        return stored

    def clear(self, fault_id: str = "", *, all: bool = False) -> None:
        if fault_id and all:
            raise InvalidArgumentError("name one fault (id) or all, not both", field="all")
        if not fault_id and not all:
            raise InvalidArgumentError(
                "id is required (clearing every fault takes all=true)", field="id"
            )
        if fault_id and fault_id not in self.faults:
            raise NotFoundError(
                f"no RDMA plane fault {quote(fault_id)}; active: "
                f"{', '.join(self.faults) or 'none'}",
                field="id",
                subject=fault_id,
                reason="FAULT_NOT_FOUND",
            )
        if fault_id:
            del self.faults[fault_id]
        else:
            self.faults.clear()
        self._reapply()

    def expired(self, now_s: float) -> list[str]:
        return [i for i, f in self.faults.items() if f.for_s and f.until_s <= now_s]

    def next_change_s(self) -> float | None:
        return min((f.until_s for f in self.faults.values() if f.for_s), default=None)

    def _reapply(self) -> None:
        self.graph.reset()
        for fault in self.faults.values():
            gateway.PLANE[fault.kind].apply(self.graph, fault)
        self.graph.changed()
