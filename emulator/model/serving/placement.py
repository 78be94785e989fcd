"""Expert placement: which experts each die of a serving instance holds.

The published layouts (HARDWARE.md, "Serving layout used on the real system") fill every die with
the same number of expert slots and split the slots the same way: a tenth hold copies of the shared
expert, the routed experts take one slot each, and what is left holds redundant copies of routed
experts. Decode EP320 has one slot per die (32 shared-expert dies, 256 routed, 32 redundant);
prefill EP32 has ten per die (1 shared, 8 routed, 1 redundant on each). `layout` derives that shape
for any number of dies; a *policy*, registered by name in POLICIES, decides which routed experts
get the redundant copies and on which dies every copy goes.

Tokens routed to an expert are split evenly among its copies, so a die's load is the sum of its
copies' shares; the instance runs at the pace of its busiest die. `ExpertPlacement.imbalance` (the
busiest die's routed load over the mean of the dies that hold routed experts) is the factor the
cost model stretches expert compute by.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError


class SlotKind(StrEnum):
    SHARED = "shared"
    ROUTED = "routed"  # the first copy of a routed expert
    REDUNDANT = "redundant"  # a further copy of a routed expert


@dataclass(frozen=True, kw_only=True)
class Slot:
    kind: SlotKind
    expert: int  # the routed expert's index; 0 for the shared expert
    load: float  # this copy's share of the routed tokens (0 for shared copies)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How many slots of each kind an instance has: the shape every policy fills."""

    dies: int
    slots_per_die: int
    routed: int
    shared_copies: int
    redundant: int

    @property
    def slots(self) -> int:
        return self.dies * self.slots_per_die


def layout(
    *, dies: int, routed_experts: int, shared_fraction: float, redundant_fraction: float
) -> Layout:
    """The published split for `dies` dies: slots per die chosen so that the routed experts fill
    at most (1 - shared_fraction - redundant_fraction) of the slots, a `shared_fraction` of them
    (at least one) shared copies and the rest redundant."""
    if dies <= 0:
        raise InvalidArgumentError(f"an instance needs dies, got {dies}", field="dies")
    if routed_experts <= 0:
        raise InvalidArgumentError(
            f"routed_experts must be > 0, got {routed_experts}", field="routed_experts"
        )
    routed_share = 1.0 - shared_fraction - redundant_fraction
    if not (0 <= shared_fraction < 1 and 0 <= redundant_fraction < 1 and routed_share > 0):
        raise InvalidArgumentError(
            "shared and redundant fractions must be in [0, 1) and leave room for routed experts"
        )
    per_die = max(1, math.ceil(routed_experts / routed_share / dies - 1e-9))
    slots = per_die * dies
    shared = max(1, round(slots * shared_fraction)) if shared_fraction > 0 else 0
    while slots - shared < routed_experts:  # rounding left too few: one more slot per die
        per_die += 1
        slots = per_die * dies
        shared = max(1, round(slots * shared_fraction)) if shared_fraction > 0 else 0
    return Layout(
        dies=dies,
        slots_per_die=per_die,
        routed=routed_experts,
        shared_copies=shared,
        redundant=slots - shared - routed_experts,
    )


@dataclass(frozen=True, kw_only=True)
class ExpertPlacement:
    policy: str
    dies: tuple[str, ...]
    slots: tuple[tuple[Slot, ...], ...]  # per die, in the order of `dies`
    replicas: tuple[int, ...]  # copies of each routed expert
    imbalance: float  # busiest die's routed load / mean over dies holding routed experts

    def experts_on(self, die: str) -> tuple[Slot, ...]:
        try:
            return self.slots[self.dies.index(die)]
        except ValueError:
            raise UnknownNameError("die", die, self.dies, field="die") from None

    def count(self, kind: SlotKind) -> int:
        return sum(s.kind is kind for slots in self.slots for s in slots)

    def die_loads(self) -> tuple[float, ...]:
        return tuple(sum(s.load for s in slots) for slots in self.slots)

    def summary(self) -> dict[str, float | int | str]:
        """What GetDeployment reports: counts per kind, slots per die, the imbalance."""
        return {
            "policy": self.policy,
            "dies": len(self.dies),
            "slots_per_die": len(self.slots[0]) if self.slots else 0,
            "shared": self.count(SlotKind.SHARED),
            "routed": self.count(SlotKind.ROUTED),
            "redundant": self.count(SlotKind.REDUNDANT),
            "imbalance": self.imbalance,
        }


# --- the policies --------------------------------------------------------------------------------


def _shared_dies(shape: Layout) -> list[int]:
    """Shared copies spread evenly: die floor(j * dies / copies) for copy j (one per die when
    there are as many copies as dies)."""
    return [j * shape.dies // shape.shared_copies for j in range(shape.shared_copies)]


def _hottest_first(loads: Sequence[float]) -> list[int]:
    return sorted(range(len(loads)), key=lambda e: (-loads[e], e))


def _replicas_hottest(shape: Layout, loads: Sequence[float]) -> list[int]:
    """One extra copy each for the `redundant` hottest experts (cycling when there are more
    redundant slots than experts)."""
    counts = [1] * shape.routed
    order = _hottest_first(loads)
    for j in range(shape.redundant):
        counts[order[j % len(order)]] += 1
    return counts


def _replicas_balanced(shape: Layout, loads: Sequence[float]) -> list[int]:
    """EPLB's replication: each redundant slot goes to the expert whose copies carry the most
    tokens each, so that the heaviest single copy is as light as it can be."""
    counts = [1] * shape.routed
    heap = [(-loads[e], e) for e in range(shape.routed)]
    heapq.heapify(heap)
    for _ in range(shape.redundant):
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-loads[e] / counts[e], e))
    return counts


def _copies(counts: Sequence[int], loads: Sequence[float]) -> list[Slot]:
    """Every routed copy: the first of each expert ROUTED, the others REDUNDANT."""
    return [
        Slot(
            kind=SlotKind.ROUTED if c == 0 else SlotKind.REDUNDANT,
            expert=e,
            load=loads[e] / n,
        )
        for e, n in enumerate(counts)
        for c in range(n)
    ]


def _empty(shape: Layout) -> list[list[Slot]]:
    dies: list[list[Slot]] = [[] for _ in range(shape.dies)]
    for d in _shared_dies(shape):
        dies[d].append(Slot(kind=SlotKind.SHARED, expert=0, load=0.0))
    return dies


def _fill_by_level(shape: Layout, copies: list[Slot]) -> list[list[Slot]]:
    """Positional: slot level by slot level, each die with room takes the next copy in turn:
    routed experts in index order, then the redundant copies."""
    dies = _empty(shape)
    ordered = [c for c in copies if c.kind is SlotKind.ROUTED] + [
        c for c in copies if c.kind is SlotKind.REDUNDANT
    ]
    it = iter(ordered)
    for _ in range(shape.slots_per_die):
        for slots in dies:
            if len(slots) < shape.slots_per_die:
                slot = next(it, None)
                if slot is None:
                    return dies
                slots.append(slot)
    return dies


def _fill_balanced(shape: Layout, copies: list[Slot]) -> list[list[Slot]]:
    """Longest-processing-time first: the heaviest copy goes to the least loaded die with room,
    preferring a die that holds no copy of the same expert yet."""
    dies = _empty(shape)
    load = [0.0] * shape.dies
    held: list[set[int]] = [set() for _ in range(shape.dies)]
    for slot in sorted(copies, key=lambda c: (-c.load, c.expert)):
        room = [d for d in range(shape.dies) if len(dies[d]) < shape.slots_per_die]
        fresh = [d for d in room if slot.expert not in held[d]] or room
        best = min(fresh, key=lambda d: (load[d], len(dies[d]), d))
        dies[best].append(slot)
        load[best] += slot.load
        held[best].add(slot.expert)
    return dies


@dataclass(frozen=True)
class Policy:
    replicas: Callable[[Layout, Sequence[float]], list[int]]
    fill: Callable[[Layout, list[Slot]], list[list[Slot]]]
    description: str
    ideal: bool = False  # report imbalance 1: the bound no real placement reaches


POLICIES: dict[str, Policy] = {
    "static": Policy(
        _replicas_hottest,
        _fill_by_level,
        "routed experts in index order across the dies; redundant copies of the hottest",
    ),
    "eplb": Policy(
        _replicas_balanced,
        _fill_balanced,
        "load-balanced (EPLB): replicas where each copy carries most, packed heaviest first",
    ),
    "ideal": Policy(
        _replicas_balanced,
        _fill_balanced,
        "EPLB's placement, costed as if every die carried exactly the mean load",
        ideal=True,
    ),
}
DEFAULT_POLICY = "static"


def _loads(shape: Layout, histogram: Sequence[float] | None) -> list[float]:
    """Each routed expert's share of the routed tokens (uniform without a histogram)."""
    if histogram is None:
        return [1.0 / shape.routed] * shape.routed
    if len(histogram) != shape.routed:
        raise InvalidArgumentError(
            f"the expert-load histogram has {len(histogram)} entries for {shape.routed} "
            "routed experts",
            field="histogram",
        )
    if any(not (h >= 0 and math.isfinite(h)) for h in histogram):
        raise InvalidArgumentError("expert loads must be finite and >= 0", field="histogram")
    total = float(sum(histogram))
    if total <= 0:
        raise InvalidArgumentError("the expert-load histogram is all zero", field="histogram")
    return [h / total for h in histogram]


def _imbalance(dies: list[list[Slot]]) -> float:
    routed = [sum(s.load for s in slots) for slots in dies if any(s.load > 0 for s in slots)]
    if not routed:
        return 1.0
    mean = sum(routed) / len(routed)
    return max(routed) / mean if mean > 0 else 1.0


def place(
    shape: Layout,
    die_ids: Sequence[str],
    *,
    policy: str = DEFAULT_POLICY,
    histogram: Sequence[float] | None = None,
) -> ExpertPlacement:
    """Place the experts of `shape` on `die_ids` by the named policy, from an expert-load
    histogram (tokens per routed expert; uniform when None)."""
    chosen = POLICIES.get(policy)
    if chosen is None:
        raise UnknownNameError("placement policy", policy, POLICIES, field="placement")
    if len(die_ids) != shape.dies:
        raise InvalidArgumentError(
            f"the layout is for {shape.dies} dies, {len(die_ids)} given", field="dies"
        )
    if len(set(die_ids)) != len(die_ids):
        raise InvalidArgumentError("a die appears twice", field="dies")
    loads = _loads(shape, histogram)
    counts = chosen.replicas(shape, loads)
    dies = chosen.fill(shape, _copies(counts, loads))
    return ExpertPlacement(
        policy=policy,
        dies=tuple(die_ids),
        slots=tuple(tuple(slots) for slots in dies),
        replicas=tuple(counts),
        imbalance=1.0 if chosen.ideal else _imbalance(dies),
    )


# --- losing dies ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Remap:
    """An instance's placement after it lost dies.

    Tokens of an expert that kept a copy go to its remaining copies. An expert that lost every
    copy takes over a redundant slot on a surviving die (the copy whose expert keeps the lightest
    load per copy without it, as EPLB would give it up): its weights load there from EMS. When no
    redundant slot is left the expert still gets a slot, as an extra one on the least loaded
    surviving die (`overflow`): the instance keeps serving, degraded, at the imbalance that costs.
    A lost shared-expert copy needs no slot while another survives; the last one goes the same
    way as a routed expert."""

    placement: ExpertPlacement  # over the surviving dies, in their order
    lost: tuple[str, ...]
    moved: tuple[tuple[int, str], ...]  # (expert, die) given a redundant slot; -1: the shared one
    overflow: tuple[tuple[int, str], ...]  # (expert, die) given an extra slot: degraded

    @property
    def degraded(self) -> bool:
        return bool(self.overflow)


_SHARED = -1  # the shared expert, among routed ones in a remap's bookkeeping


def remap(p: ExpertPlacement, lost: Sequence[str]) -> Remap:
    """`p` without the dies `lost` (each one of `p.dies`): see Remap."""
    unknown = sorted(set(lost) - set(p.dies))
    if unknown:
        raise UnknownNameError("die", unknown[0], p.dies, field="die")
    gone = set(lost)
    keep = [i for i, d in enumerate(p.dies) if d not in gone]
    if not keep:
        raise InvalidArgumentError("every die of the instance is lost: nothing to remap to")
    total = [0.0] * len(p.replicas)  # each routed expert's share of the tokens
    for slots in p.slots:
        for s in slots:
            if s.kind is not SlotKind.SHARED:
                total[s.expert] += s.load

    def key(s: Slot) -> int:
        return _SHARED if s.kind is SlotKind.SHARED else s.expert

    dies: list[list[Slot]] = [list(p.slots[i]) for i in keep]
    names = [p.dies[i] for i in keep]
    copies: dict[int, int] = {}
    for row in dies:
        for s in row:
            copies[key(s)] = copies.get(key(s), 0) + 1
    had_shared = any(s.kind is SlotKind.SHARED for slots in p.slots for s in slots)
    orphans = [e for e in range(len(total)) if copies.get(e, 0) == 0]
    orphans.sort(key=lambda e: (-total[e], e))
    if had_shared and copies.get(_SHARED, 0) == 0:
        orphans.append(_SHARED)
    moved: list[tuple[int, str]] = []
    overflow: list[tuple[int, str]] = []
    for orphan in orphans:
        donor = _donor(dies, copies, total)
        fresh = Slot(kind=SlotKind.SHARED, expert=0, load=0.0)
        if orphan != _SHARED:
            fresh = Slot(kind=SlotKind.ROUTED, expert=orphan, load=0.0)
        if donor is not None:
            d, k = donor
            copies[key(dies[d][k])] -= 1
            dies[d][k] = fresh
            moved.append((orphan, names[d]))
        else:
            load = [
                sum(total[key(s)] / copies[key(s)] for s in slots if key(s) >= 0) for slots in dies
            ]
            d = min(range(len(dies)), key=lambda i: (load[i], len(dies[i]), i))
            dies[d].append(fresh)
            overflow.append((orphan, names[d]))
        copies[orphan] = copies.get(orphan, 0) + 1
    placed = _reload(dies, copies, total)
    return Remap(
        placement=ExpertPlacement(
            policy=p.policy,
            dies=tuple(names),
            slots=tuple(tuple(slots) for slots in placed),
            replicas=tuple(copies.get(e, 0) for e in range(len(total))),
            imbalance=1.0 if POLICIES[p.policy].ideal else _imbalance(placed),
        ),
        lost=tuple(lost),
        moved=tuple(moved),
        overflow=tuple(overflow),
    )


def _donor(
    dies: list[list[Slot]], copies: dict[int, int], total: Sequence[float]
) -> tuple[int, int] | None:
    """The redundant copy to give up: of an expert with another copy left, the one whose copies
    carry the least each once it is gone (the lowest die and slot on a tie)."""
    best: tuple[float, int, int] | None = None
    for d, slots in enumerate(dies):
        for k, s in enumerate(slots):
            if s.kind is SlotKind.SHARED or copies.get(s.expert, 0) < 2:
                continue
            after = total[s.expert] / (copies[s.expert] - 1)
            if best is None or after < best[0]:
                best = (after, d, k)
    return None if best is None else (best[1], best[2])


def _reload(
    dies: list[list[Slot]], copies: dict[int, int], total: Sequence[float]
) -> list[list[Slot]]:
    """Every routed copy's share again (an expert's tokens split evenly among its copies), the
    first copy of each ROUTED and the others REDUNDANT."""
    seen: set[int] = set()
    out: list[list[Slot]] = []
    for slots in dies:
        row = []
        for s in slots:
            if s.kind is SlotKind.SHARED:
                row.append(s)
                continue
            kind = SlotKind.REDUNDANT if s.expert in seen else SlotKind.ROUTED
            seen.add(s.expert)
            row.append(Slot(kind=kind, expert=s.expert, load=total[s.expert] / copies[s.expert]))
        out.append(row)
    return out
