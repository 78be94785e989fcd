"""Allocation policies, registered by name: which free NPUs a request gets.

A policy sees the free NPUs node by node (`FreeNode`, in node order) and returns the NPUs it
chooses, or None when the request does not fit. What every policy shares, the request's
constraints, is applied around it by `place`: `whole_nodes` shows it only the nodes that are
entirely free, `same_rack` shows it one rack at a time (in the policy's rack order).

- first-fit: the first free NPUs in id order; cheap, and it scatters jobs over many nodes.
- best-fit: the node whose free NPUs fit the request most tightly; a request larger than any
  node's free NPUs takes the fullest nodes first, then fits its remainder tightly.
- topology-aware: the fewest racks, then the fewest nodes; whole nodes stay whole (a job of
  k*8+r NPUs takes k entirely free nodes and fits its r in a node already in use where it can),
  so large jobs still find whole nodes later and every job's traffic stays on as few L1 planes
  and racks as possible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby

from cmemu.emulator.model.errors import UnknownNameError

DEFAULT_POLICY = "topology-aware"


@dataclass(frozen=True, kw_only=True)
class FreeNode:
    """A node's free NPUs (id order) out of `capacity`, the NPUs it has."""

    id: str
    rack: int
    order: int  # its place in the inventory: ties go to the earlier node
    free: tuple[str, ...]
    capacity: int

    @property
    def whole(self) -> bool:
        return len(self.free) == self.capacity


Pick = Callable[[Sequence[FreeNode], int], list[str] | None]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A placement policy by name: how it picks NPUs and orders racks."""

    name: str
    description: str
    pick: Pick
    tight_racks: bool  # same_rack: try the rack with the fewest free NPUs first (else rack order)


POLICIES: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    POLICIES[policy.name] = policy
    return policy


def get_policy(name: str, field: str = "policy") -> Policy:
    try:
        return POLICIES[name or DEFAULT_POLICY]
    except KeyError:
        raise UnknownNameError("policy", name, POLICIES, field=field) from None


def _total(nodes: Iterable[FreeNode]) -> int:
    return sum(len(n.free) for n in nodes)


# --- first-fit -------------------------------------------------------------------------------


def first_fit(nodes: Sequence[FreeNode], n: int) -> list[str] | None:
    chosen: list[str] = []
    for node in nodes:
        chosen.extend(node.free[: n - len(chosen)])
        if len(chosen) == n:
            return chosen
    return None


# --- best-fit --------------------------------------------------------------------------------


def best_fit(nodes: Sequence[FreeNode], n: int) -> list[str] | None:
    if _total(nodes) < n:
        return None
    left = [x for x in nodes if x.free]
    chosen: list[str] = []
    while len(chosen) < n:
        need = n - len(chosen)
        fits = [x for x in left if len(x.free) >= need]
        if fits:
            node = min(fits, key=lambda x: (len(x.free), x.order))
            return chosen + list(node.free[:need])
        node = max(left, key=lambda x: (len(x.free), -x.order))
        chosen.extend(node.free)
        left.remove(node)
    return chosen


# --- topology-aware --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """A candidate placement, scored by the nodes it spans and breaks."""

    npus: list[str]
    nodes: int  # nodes it spans
    broken: int  # entirely free nodes it takes only part of
    leftover: int  # free NPUs left on the partly used nodes it touches


def _plan(nodes: Sequence[FreeNode], n: int) -> _Plan | None:
    """k whole nodes and the remainder in the tightest partly used node; else best-fit."""
    if not nodes or _total(nodes) < n:
        return None
    capacity = max(x.capacity for x in nodes)
    k, r = divmod(n, capacity)
    whole = [x for x in nodes if x.whole and x.capacity == capacity]
    chosen: list[FreeNode] = []
    npus: list[str] | None = None
    if len(whole) >= k:
        chosen = whole[:k]
        npus = [p for x in chosen for p in x.free]
        if r:
            rest = [x for x in nodes if x not in chosen and len(x.free) >= r]
            if rest:
                tail = min(rest, key=lambda x: (x.whole, len(x.free), x.order))
                chosen.append(tail)
                npus += tail.free[:r]
            else:
                npus = None
    if npus is None:
        npus = best_fit(nodes, n)
        if npus is None:
            return None
        used = {p for p in npus}
        chosen = [x for x in nodes if used.intersection(x.free)]
    used = set(npus)
    partial = [x for x in chosen if not used.issuperset(x.free)]
    return _Plan(
        npus=npus,
        nodes=len(chosen),
        broken=sum(x.whole for x in partial),
        leftover=sum(len(x.free) - len(used.intersection(x.free)) for x in partial),
    )


def _racks(nodes: Sequence[FreeNode]) -> list[list[FreeNode]]:
    return [
        list(group)
        for _, group in groupby(
            sorted(nodes, key=lambda x: (x.rack, x.order)), key=lambda x: x.rack
        )
    ]


def topology_aware(nodes: Sequence[FreeNode], n: int) -> list[str] | None:
    racks = _racks(nodes)
    best: tuple[tuple[int, int, int, int, int], _Plan] | None = None
    for rack in racks:
        free = _total(rack)
        if free < n:
            continue
        plan = _plan(rack, n)
        if plan is None:
            continue
        score = (plan.nodes, plan.broken, plan.leftover, free - n, rack[0].rack)
        if best is None or score < best[0]:
            best = (score, plan)
    if best is not None:
        return best[1].npus
    # No rack holds it: the fewest racks (the freest first, then those with the most whole
    # nodes), then the same plan across them.
    scope: list[FreeNode] = []
    for rack in sorted(racks, key=lambda r: (-_total(r), -sum(x.whole for x in r), r[0].rack)):
        scope.extend(rack)
        if _total(scope) >= n:
            plan = _plan(sorted(scope, key=lambda x: x.order), n)
            return None if plan is None else plan.npus
    return None


register(
    Policy(
        name="first-fit",
        description="the first free NPUs in id order",
        pick=first_fit,
        tight_racks=False,
    )
)
register(
    Policy(
        name="best-fit",
        description="the node whose free NPUs fit most tightly; big jobs take the fullest first",
        pick=best_fit,
        tight_racks=True,
    )
)
register(
    Policy(
        name="topology-aware",
        description="fewest racks, then fewest nodes; whole nodes kept whole, fragments filled",
        pick=topology_aware,
        tight_racks=True,
    )
)


def place(
    policy: Policy, nodes: Sequence[FreeNode], n: int, *, whole_nodes: bool, same_rack: bool
) -> list[str] | None:
    """The NPUs `policy` gives a request of `n` under its constraints, or None: it does not fit."""
    if whole_nodes:
        nodes = [x for x in nodes if x.whole]
    if not same_rack:
        return policy.pick(nodes, n)
    racks = _racks(nodes)
    if policy.tight_racks:
        racks.sort(key=lambda r: (_total(r), r[0].rack))
    for rack in racks:
        if _total(rack) >= n:
            chosen = policy.pick(rack, n)
            if chosen is not None:
                return chosen
    return None
