"""The fabric's link graph and what runs on it (its faults, the flows in flight, the collectives'
threads), made at their first use: cm384's graph is 50-100 ms of CPU, a tenth of a boot, and
nothing runs on it before a transfer, a fault or a question comes. A launcher makes it once it is
ready (`warm`: `cmemu up` after its state file, runtime/registry.py), so that the first transfer
does not wait for it either. The graph, the flows and the collectives are numpy's (85 ms of
imports): their modules are imported here too, where the parts are made, not with the engine's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.linkfaults import FaultSet
from cmemu.emulator.model.topology import Topology

if TYPE_CHECKING:  # numpy's side: imported where the parts are made (_made)
    from cmemu.emulator.engines.fabric.collectives import Collectives
    from cmemu.emulator.engines.flows import FlowClock
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True)
class _Parts:
    """What is made together at the first use: the graph and what runs on it."""

    graph: LinkGraph
    faults: FaultSet
    flows: FlowClock
    collectives: Collectives


class LazyGraph:
    """The fabric engine's graph, faults, flows and collectives, made together when first asked."""

    topology: Topology
    profile: HardwareProfile
    clock: Timeline
    _closing: bool  # the engine is stopping: nothing more is made

    def __init__(self) -> None:
        self._parts: _Parts | None = None
        self._built = asyncio.Event()  # the engine's clocks start once there is a graph

    @property
    def built(self) -> bool:
        """Whether the link graph is made (by a first use, or `warm`)."""
        return self._parts is not None

    @property
    def graph(self) -> LinkGraph:
        return self._made().graph

    @property
    def faults(self) -> FaultSet:
        return self._made().faults

    @property
    def flows(self) -> FlowClock:
        return self._made().flows

    @property
    def collectives(self) -> Collectives:
        return self._made().collectives

    def warm(self) -> None:
        """Make the link graph now, if nothing has asked for it yet: what a launcher calls once
        it is ready, so that the first transfer does not wait for it."""
        if self._parts is None and not self._closing:
            self._made()

    def _made(self) -> _Parts:
        if self._parts is not None:
            return self._parts
        from cmemu.emulator.engines.fabric.collectives import Collectives
        from cmemu.emulator.engines.flows import FlowClock
        from cmemu.emulator.model.linkgraph import LinkGraph

        graph = LinkGraph(self.topology, self.profile)
        self._parts = _Parts(
            graph=graph,
            faults=FaultSet(graph),
            flows=FlowClock(
                clock=self.clock,
                res_cap=graph.trunk_cap(),
                cut_message="a fault cut the route of this transfer",
            ),
            collectives=Collectives(graph, self.profile.limits),
        )
        self._built.set()
        return self._parts
