"""The fabric's active faults on its link graph (FaultSet), as Toxiproxy runs its toxics.

Each fault kind is one module of emulator/model/faults/fabric/ (its params, checks, help,
effect and wire mapping), registered by name in that package's KINDS. What every fault shares
belongs here, never to a kind: an id, a duration, checking the spec's params and target before
it is stored, re-applying every fault to a clean graph whenever one is added or cleared, a
flap's phase, and what the rank kinds say of a collective's ranks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.faults import fabric
from cmemu.emulator.model.faults.fabric import (
    FaultSpec,
    link_flap,
    of_kind,
    rank_down,
    rank_hung,
    rank_slow,
)
from cmemu.emulator.model.faults.fabric.link_flap import flap_down, next_flip_s

if TYPE_CHECKING:  # a fault record needs no numpy: a device process imports this module
    from cmemu.emulator.model.linkgraph import LinkGraph

__all__ = ["FaultSet", "FaultSpec", "RankState"]

RANK_KINDS = (rank_down.NAME, rank_hung.NAME, rank_slow.NAME)


@dataclass(frozen=True)
class RankState:
    """What the rank faults say of a set of ranks: the first dead one, the first hung one, and
    the slowest one's compute share (1.0: none slowed)."""

    down: str | None = None
    hung: str | None = None
    compute_share: float = 1.0
    slowed: Mapping[str, float] = field(default_factory=dict)  # each slowed rank's share


@dataclass
class FaultSet:
    """The active faults of one fabric; the graph always equals a clean graph plus all of them."""

    graph: LinkGraph
    faults: dict[str, FaultSpec[Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, spec: FaultSpec[Any]) -> FaultSpec[Any]:
        kind = fabric.kind_of(fabric.checked(spec).kind)
        kind.effect.validate(self.graph, spec)
        if not (math.isfinite(spec.for_s) and spec.for_s >= 0):
            raise InvalidArgumentError(
                f"for_s must be >= 0 (0: until cleared), got {spec.for_s}", field="for_s"
            )
        stored = replace(spec, id=f"f{next(self._ids)}")
        if of_kind(stored, link_flap.KIND):
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

    def flap(self, now_s: float) -> list[FaultSpec[Any]]:
        """Bring every flapping link to its state at `now_s`; the faults that changed."""
        changed = []
        for fault_id, spec in self.faults.items():
            if of_kind(spec, link_flap.KIND) and flap_down(spec, now_s) != spec.down:
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
        times += [next_flip_s(f, now_s) for f in self.faults.values() if of_kind(f, link_flap.KIND)]
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
                if f.kind == rank_down.NAME and down is None:
                    down = name
                elif f.kind == rank_hung.NAME and hung is None:
                    hung = name
                elif of_kind(f, rank_slow.KIND):
                    share = min(share, f.params.factor)
                    slowed[name] = min(slowed.get(name, 1.0), f.params.factor)
        return RankState(down=down, hung=hung, compute_share=share, slowed=slowed)

    def _reapply(self) -> None:
        self.graph.reset()
        for spec in self.faults.values():
            fabric.KINDS[spec.kind].effect.apply(self.graph, spec)
        self.graph.invalidate()
