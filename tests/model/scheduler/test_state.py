"""The allocation state on cm384's inventory: allocate, release, spares, failures, replacement."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    UnknownNameError,
)
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scheduler import Inventory, JobRequest, PendingQueue, Scheduler
from cmemu.emulator.model.topology import build


@pytest.fixture(scope="module")
def cm384() -> Inventory:
    return Inventory.from_topology(build("cm384"), DEFAULT_PROFILE)


def test_the_inventory_has_racks_of_four_nodes(cm384: Inventory) -> None:
    assert cm384.size == 384 and len(cm384.nodes) == 48
    assert cm384.racks == list(range(12))
    assert cm384.rack_of("n07-npu3") == 1 and cm384.node_of("n07-npu3") == "n07"
    assert cm384.dies("n07-npu3") == ["n07-npu3.d0", "n07-npu3.d1"]
    assert Inventory.from_counts(nodes=28).size == 224
    with pytest.raises(NotFoundError):
        cm384.node_of("n48-npu0")
    with pytest.raises(InvalidArgumentError):
        cm384.node_of("npu0")


def test_a_serving_layout_fits_and_releases(cm384: Inventory) -> None:
    s = Scheduler(cm384, spares=12)
    assert len(s.spares) == 12
    assert len({cm384.rack_of(p) for p in s.spares}) == 12  # one per rack
    decode = s.allocate(JobRequest(job="decode", npus=160), now_ns=5)
    assert len(decode.npus) == 160 and decode.allocated_ns == 5
    prefill = [s.allocate(JobRequest(job=f"prefill-{i}", npus=16), 0) for i in range(13)]
    assert s.free_count == 384 - 12 - 160 - 13 * 16
    held = [p for a in s.allocations() for p in a.npus]
    assert len(held) == len(set(held)) and not set(held) & set(s.spares)
    assert all(len({cm384.node_of(p) for p in a.npus}) == 2 for a in prefill[:6])
    released = s.release("decode")
    assert released.npus == decode.npus and s.free_count == 4 + 160
    with pytest.raises(NotFoundError, match="no job 'decode'"):
        s.release("decode")


def test_bad_requests_are_refused_before_anything_changes(cm384: Inventory) -> None:
    s = Scheduler(cm384, spares=0)
    bad = [
        (JobRequest(job="", npus=1), InvalidArgumentError),
        (JobRequest(job="a b", npus=1), InvalidArgumentError),
        (JobRequest(job="j", npus=0), InvalidArgumentError),
        (JobRequest(job="j", npus=385), OutOfRangeError),
        (JobRequest(job="j", npus=12, whole_nodes=True), InvalidArgumentError),
        (JobRequest(job="j", npus=33, same_rack=True), OutOfRangeError),
        (JobRequest(job="j", npus=1, policy="random"), UnknownNameError),
    ]
    for request, error in bad:
        with pytest.raises(error):
            s.allocate(request, 0)
    assert s.free_count == 384 and not s.allocations()
    s.allocate(JobRequest(job="j", npus=1), 0)
    with pytest.raises(PreconditionError, match="already holds 1"):
        s.allocate(JobRequest(job="j", npus=1), 0)
    s.allocate(JobRequest(job="big", npus=380), 0)
    with pytest.raises(CapacityError, match="requested 8 NPUs, 3 NPUs free") as err:
        s.allocate(JobRequest(job="more", npus=8), 0)
    assert err.value.reason == "NO_ROOM"


def test_whole_nodes_and_same_rack(cm384: Inventory) -> None:
    s = Scheduler(cm384, spares=12)  # a spare in one node of each rack: 3 whole nodes a rack
    whole = s.allocate(JobRequest(job="w", npus=24, whole_nodes=True, same_rack=True), 0)
    nodes = {cm384.node_of(p) for p in whole.npus}
    assert len(nodes) == 3 and len({cm384.rack_of(p) for p in whole.npus}) == 1
    with pytest.raises(CapacityError):  # 36 whole nodes exist, 33 left
        s.allocate(JobRequest(job="x", npus=34 * 8, whole_nodes=True), 0)


def test_failed_npus_are_never_handed_out_and_replace_prefers_near_spares(
    cm384: Inventory,
) -> None:
    s = Scheduler(cm384, spares=12)
    job = s.allocate(JobRequest(job="train", npus=24, same_rack=True), 0)
    victim = job.npus[0]
    assert s.mark_failed([victim]) == ["train"]
    assert s.get("train").failed == {victim}
    (swap,) = s.replace("train", npu=victim)[1]
    assert swap.old == victim and cm384.rack_of(swap.new) == cm384.rack_of(victim)
    after = s.get("train")
    assert victim not in after.npus and swap.new in after.npus and not after.failed
    assert victim in s.failed and victim not in s.free_npus() and len(s.spares) == 12
    # a whole failed node: its free NPUs leave service, a job on it is told
    node = cm384.node_of(after.npus[-1])
    affected = s.mark_failed(cm384.node(node).npus)
    assert affected == ["train"]
    new, swaps = s.replace("train", node=node)
    assert {x.old for x in swaps} == {p for p in after.npus if cm384.node_of(p) == node}
    assert not any(cm384.node_of(p) == node for p in new.npus)
    s.release("train")
    assert not set(s.failed) & set(s.free_npus())
    s.mark_healthy(cm384.node(node).npus)
    assert set(cm384.node(node).npus) <= set(s.free_npus()) | set(s.spares)


def test_replace_refuses_clearly(cm384: Inventory) -> None:
    s = Scheduler(cm384, spares=0)
    job = s.allocate(JobRequest(job="j", npus=8), 0)
    with pytest.raises(CapacityError, match="too few left") as err:
        s.replace("j", npu=job.npus[0])
    assert err.value.reason == "NO_SPARES"
    with pytest.raises(PreconditionError, match="holds no NPU"):
        s.replace("j", npu="n47-npu7")
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        s.replace("j", npu=job.npus[0], node="n00")
    with pytest.raises(NotFoundError):
        s.replace("nobody", npu=job.npus[0])


def test_spares_follow_their_target(cm384: Inventory) -> None:
    s = Scheduler(cm384, spares=24)
    assert len(s.spares) == 24
    assert all(n == 2 for n in _per_rack(cm384, s.spares).values())
    s.set_spares(6)
    assert len(s.spares) == 6 and s.free_count == 378
    with pytest.raises(CapacityError):
        s.set_spares(385)
    with pytest.raises(InvalidArgumentError):
        s.set_spares(-1)
    s.allocate(JobRequest(job="all", npus=378), 0)
    s.set_spares(6)
    job = s.get("all")
    s.replace("all", npu=job.npus[0])  # the replaced NPU, healthy, refills the spares
    assert len(s.spares) == 6


def _per_rack(inventory: Inventory, npus: list[str]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for p in npus:
        counts[inventory.rack_of(p)] = counts.get(inventory.rack_of(p), 0) + 1
    return counts


def test_the_pending_queue_orders_by_priority_then_arrival() -> None:
    q = PendingQueue()
    for job, priority in (("a", 0), ("b", 5), ("c", 0), ("d", 5)):
        q.push(JobRequest(job=job, npus=1, priority=priority))
    assert [r.job for r in q] == ["b", "d", "a", "c"]
    assert q.pop().job == "b" and q.head().job == "d" and len(q) == 3
