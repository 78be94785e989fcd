"""The fabric's link graph and what runs on it (its faults, the flows in flight, the collectives'
threads), made at their first use: cm384's graph is 50-100 ms of CPU, a tenth of a boot, and
nothing runs on it before a transfer, a fault or a question comes. A launcher makes it once it is
ready (`warm`: `cmemu up` after its state file, runtime/registry.py), so that the first transfer
does not wait for it either. The graph, the flows and the collectives are numpy's (85 ms of
imports): their modules are imported here too, where the parts are made, not with the engine's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.linkfaults import FaultSet
from cmemu.emulator.model.topology import Topology

if TYPE_CHECKING:  # numpy's side: imported where the parts are made (_made)
    from cmemu.emulator.engines.fabric.collectives import Collectives
    from cmemu.emulator.engines.flows import FlowClock
    from cmemu.emulator.model.linkgraph import LinkGraph

T = TypeVar("T")


class _Part(Generic[T]):
    """One of the parts, read as an attribute: the first read makes them all (`_made`), which
    puts each in the instance's own dictionary, where every later read finds it before this
    (a non-data descriptor): a transfer reads the graph and the flows four times, which as
    properties were eight Python calls, as attributes none."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> _Part[T]: ...
    @overload
    def __get__(self, instance: LazyGraph, owner: type) -> T: ...
    def __get__(self, instance: LazyGraph | None, owner: type) -> _Part[T] | T:
        if instance is None:
            return self
        instance._made()
        return cast(T, instance.__dict__[self.name])


class LazyGraph:
    """The fabric engine's graph, faults, flows and collectives, made together when first asked."""

    topology: Topology
    profile: HardwareProfile
    clock: Timeline
    _closing: bool  # the engine is stopping: nothing more is made

    graph: _Part[LinkGraph] = _Part()
    faults: _Part[FaultSet] = _Part()
    flows: _Part[FlowClock] = _Part()
    collectives: _Part[Collectives] = _Part()

    def __init__(self) -> None:
        self._built = asyncio.Event()  # the engine's clocks start once there is a graph

    @property
    def built(self) -> bool:
        """Whether the link graph is made (by a first use, or `warm`)."""
        return "graph" in self.__dict__

    def warm(self) -> None:
        """Make the link graph now, if nothing has asked for it yet: what a launcher calls once
        it is ready, so that the first transfer does not wait for it."""
        if not self.built and not self._closing:
            self._made()

    def _made(self) -> None:
        if self.built:
            return
        from cmemu.emulator.engines.fabric.collectives import Collectives
        from cmemu.emulator.engines.flows import FlowClock
        from cmemu.emulator.model.linkgraph import LinkGraph

        graph = LinkGraph(self.topology, self.profile)
        parts = {
            "faults": FaultSet(graph),
            "flows": FlowClock(
                clock=self.clock,
                res_cap=graph.trunk_cap(),
                cut_message="a fault cut the route of this transfer",
            ),
            "collectives": Collectives(graph, self.profile.limits),
            "graph": graph,  # last: `built` is whether it is here
        }
        self.__dict__.update(parts)
        self._built.set()
