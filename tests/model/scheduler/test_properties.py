"""Property: whatever sequence of operations, every NPU is in exactly one state (free, one job's,
spare, failed), no NPU is in two allocations or both spare and allocated, and a failed NPU is
never handed out."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scheduler import POLICIES, Inventory, JobRequest, Scheduler

INVENTORY = Inventory.from_counts(nodes=8, profile=DEFAULT_PROFILE)  # 64 NPUs, 2 racks
NPUS = INVENTORY.npus
NODES = [n.id for n in INVENTORY.nodes]
JOBS = [f"job{i}" for i in range(3)]


@dataclass(frozen=True)
class Op:
    kind: str
    job: str = ""
    npus: int = 0
    policy: str = ""
    whole_nodes: bool = False
    same_rack: bool = False
    npu: str = ""
    node: str = ""
    count: int = 0


allocate = st.builds(
    Op,
    kind=st.just("allocate"),
    job=st.sampled_from(JOBS),
    npus=st.sampled_from([0, 1, 2, 3, 5, 8, 16, 24, 33, 65]),
    policy=st.sampled_from(sorted(POLICIES)),
    whole_nodes=st.booleans(),
    same_rack=st.booleans(),
)
ops = st.one_of(
    allocate,
    allocate,
    allocate,
    st.builds(Op, kind=st.just("release"), job=st.sampled_from(JOBS)),
    st.builds(Op, kind=st.just("fail"), npu=st.sampled_from(NPUS)),
    st.builds(Op, kind=st.just("fail-node"), node=st.sampled_from(NODES)),
    st.builds(Op, kind=st.just("heal"), npu=st.sampled_from(NPUS)),
    st.builds(Op, kind=st.just("heal-node"), node=st.sampled_from(NODES)),
    st.builds(Op, kind=st.just("replace"), job=st.sampled_from(JOBS), npu=st.sampled_from(NPUS)),
    # one of the job's own NPUs (count: which), as a controller replacing a failed one would
    st.builds(Op, kind=st.just("replace-own"), job=st.sampled_from(JOBS), count=st.integers(0, 63)),
    st.builds(
        Op, kind=st.just("replace-node"), job=st.sampled_from(JOBS), node=st.sampled_from(NODES)
    ),
    st.builds(Op, kind=st.just("spares"), count=st.integers(0, 12)),
)


def _apply(s: Scheduler, op: Op) -> None:
    if op.kind == "allocate":
        request = JobRequest(
            job=op.job,
            npus=op.npus,
            policy=op.policy,
            whole_nodes=op.whole_nodes,
            same_rack=op.same_rack,
        )
        failed = set(s.failed)
        allocation = s.allocate(request, 0)
        assert not failed & set(allocation.npus), "a failed NPU was handed out"
        assert len(allocation.npus) == op.npus
        if op.same_rack:
            assert len({INVENTORY.rack_of(p) for p in allocation.npus}) == 1
        if op.whole_nodes:
            for node in {INVENTORY.node_of(p) for p in allocation.npus}:
                assert set(INVENTORY.node(node).npus) <= set(allocation.npus)
    elif op.kind == "release":
        s.release(op.job)
    elif op.kind in ("fail", "fail-node"):
        s.mark_failed(s.targets(npu=op.npu, node=op.node))
    elif op.kind in ("heal", "heal-node"):
        s.mark_healthy(s.targets(npu=op.npu, node=op.node))
    elif op.kind in ("replace", "replace-node", "replace-own"):
        npu = op.npu
        if op.kind == "replace-own":
            held = s.get(op.job).npus
            npu = held[op.count % len(held)]
        spares = set(s.spares)
        _, swaps = s.replace(op.job, npu=npu, node=op.node)
        assert {x.new for x in swaps} <= spares
    else:
        s.set_spares(op.count)


def _snapshot(s: Scheduler) -> tuple[object, ...]:
    return (s.allocations(), s.spares, s.failed, s.free_npus(), s.spare_target)


def _check(s: Scheduler) -> None:
    held = [p for a in s.allocations() for p in a.npus]
    assert len(held) == len(set(held)), "an NPU in two allocations"
    spares, failed, free = set(s.spares), set(s.failed), set(s.free_npus())
    assert not spares & set(held), "an NPU both spare and allocated"
    assert not spares & failed and not free & failed and not free & spares
    assert not free & set(held)
    in_jobs_failed = {p for a in s.allocations() for p in a.failed}
    assert in_jobs_failed == failed & set(held)
    assert free | spares | failed | set(held) == set(NPUS), "an NPU lost"
    assert len(spares) <= s.spare_target
    assert len(spares) == s.spare_target or not free, "spares below target while NPUs are free"


@settings(max_examples=300, deadline=None)
@given(spares=st.integers(0, 8), sequence=st.lists(ops, min_size=10, max_size=40))
def test_no_npu_is_ever_in_two_states(spares: int, sequence: list[Op]) -> None:
    s = Scheduler(INVENTORY, spares=spares)
    _check(s)
    for op in sequence:
        before = _snapshot(s)
        try:
            _apply(s, op)
        except EmulatorError:
            assert _snapshot(s) == before, f"{op} was refused but changed the state"
        _check(s)
