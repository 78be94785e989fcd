"""A job's allocation as the scheduler reports it to a caller: its NPUs with their nodes, racks
and dies, and each change of it; what a release gave back, the occupancy, the spares and the
policies. Plain values, so that the scheduler's engine (emulator/engines/scheduler/) answers
with them, the typed client returns the same, and an engine (a training job, a serving
deployment) follows them without knowing the wire; the scheduler's own record of an allocation
is jobs.Allocation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AllocatedNpu:
    """An NPU of an allocation: where it is, its dies, and whether it failed since."""

    id: str
    node: str
    rack: int
    dies: tuple[str, ...]  # the ranks of a collective
    failed: bool  # reported failed since it was allocated: replace it


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """The NPUs a job holds, where they are, and the policy that placed them."""

    job: str
    npus: tuple[AllocatedNpu, ...]  # in id order
    nodes: tuple[str, ...]
    racks: tuple[int, ...]
    policy: str  # the policy that placed it
    priority: int
    whole_nodes: bool
    same_rack: bool
    allocated_ns: int


NO_ALLOCATION = Allocation(
    job="",
    npus=(),
    nodes=(),
    racks=(),
    policy="",
    priority=0,
    whole_nodes=False,
    same_rack=False,
    allocated_ns=0,
)
"""A job's allocation before the scheduler granted one."""


@dataclass(frozen=True, kw_only=True)
class AllocationChange:
    """One change of an allocation (allocated, failed, replaced, released), as watchers see it."""

    change: str  # allocated | failed | replaced | released
    allocation: Allocation  # after the change (the last one held, for "released")
    npus: tuple[str, ...]  # the NPUs concerned (failed ones; for "replaced" the new ones)
    at_ns: int  # emulated instant of the change


@dataclass(frozen=True, kw_only=True)
class Released:
    """What a job gave back when released."""

    job: str
    npus: int  # given back, failed ones included


@dataclass(frozen=True, kw_only=True)
class Occupancy:
    """Every allocation, in the order they were made, and the NPUs' counts."""

    allocations: tuple[Allocation, ...]
    total_npus: int
    free_npus: int
    allocated_npus: int
    spare_npus: int
    failed_npus: int  # out of service, allocated or not


@dataclass(frozen=True, kw_only=True)
class Spares:
    """The NPUs kept free as spares, and how many are wanted."""

    target: int  # how many are kept, as far as free NPUs allow
    npus: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PolicyInfo:
    """An allocation policy as the scheduler lists it (`default`: the one an empty ask gets)."""

    name: str
    description: str
    default: bool
