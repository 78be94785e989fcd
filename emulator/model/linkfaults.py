"""Fabric fault kinds, registered by name in one table (as Toxiproxy registers its toxics).

A kind is a small class: it checks its own settings and applies itself to the link graph. What
every fault shares (an id, a target, validation of names, re-applying all faults from a clean
graph whenever one is added or cleared) belongs to `FaultSet`, never to a kind.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    kind: str
    target: str = ""
    factor: float = 0.0
    added_latency_s: float = 0.0
    side_a: tuple[str, ...] = ()
    side_b: tuple[str, ...] = ()
    id: str = ""


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
        if not 0 < spec.factor < 1:
            raise InvalidArgumentError(f"factor must be in (0, 1), got {spec.factor}")

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.factor[list(graph.physical(spec.target))] *= spec.factor


class LinkLatency:
    name = "link-latency"

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None:
        graph.physical(spec.target)
        if not 0 < spec.added_latency_s <= 1.0:
            raise InvalidArgumentError("added_latency_us must be in (0, 1e6]")

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
        graph.partitions.append((frozenset(spec.side_a), frozenset(spec.side_b)))


FAULT_KINDS: dict[str, FaultKind] = {
    kind.name: kind() for kind in (LinkDown, LinkDegraded, LinkLatency, SwitchDown, Partition)
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
            raise InvalidArgumentError(
                f"unknown fault kind {quote(spec.kind)}; known: {', '.join(FAULT_KINDS)}",
                field="kind",
                subject=spec.kind,
                reason="UNKNOWN_FAULT_KIND",
            )
        kind.validate(self.graph, spec)
        stored = FaultSpec(**{**spec.__dict__, "id": f"f{next(self._ids)}"})
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

    def _reapply(self) -> None:
        self.graph.reset()
        for spec in self.faults.values():
            FAULT_KINDS[spec.kind].apply(self.graph, spec)
        self.graph.invalidate()
