"""The store's decisions without any server: placement, victims, the reader's copy, repairs."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.ems import (
    HashRing,
    ObjectMeta,
    Placement,
    Replica,
    Tier,
)
from cmemu.emulator.model.errors import CapacityError, UnavailableError

POOLS = {"n00-mem": "n00", "n01-mem": "n01", "n02-mem": "n02", "n03-mem": "n03"}


def _placement(capacity: int = 1000, factor: int = 2) -> Placement:
    return Placement(
        pools=POOLS,
        ring=HashRing(list(POOLS), 64),
        capacity_per_pool=capacity,
        replication_factor=factor,
    )


def _store(p: Placement, key: str, size: int, pools: list[str], **kw: bool) -> ObjectMeta:
    meta = ObjectMeta(key=key, kind=1, size=size, crc=None, pinned=kw.get("pinned", False))
    for i, pool in enumerate(pools):
        meta.replicas[pool] = Replica(region_id=i + 1, offset=4096 * i)
    p.index.add(meta)
    return meta


def test_targets_are_the_ring_owners_among_healthy_pools() -> None:
    p = _placement()
    targets = p.targets("some-key")
    assert len(targets) == 2 and targets == p.ring.owners("some-key", 2)
    p.mark(targets[0], healthy=False)
    after = p.targets("some-key")
    assert targets[0] not in after and targets[1] == after[0]  # only the dead pool's share moves
    for pool in POOLS:
        p.mark(pool, healthy=False)
    with pytest.raises(UnavailableError):
        p.targets("some-key")


@pytest.mark.parametrize("state", ["up", "suspect", "dead"])
def test_the_up_view_names_the_usable_pools_and_targets_skip_the_rest(state: str) -> None:
    """targets() asks the ring about a view of the pools' health, not a list of the usable
    pools: the two agree for a pool in every state, and only an up pool is a target."""
    p = _placement()
    first = p.targets("some-key")[0]
    if state == "suspect":
        p.suspect(first, now_ns=1)
    elif state == "dead":
        p.mark(first, healthy=False)
    assert {pool for pool in POOLS if pool in p.up()} == set(p.usable())
    assert (first in p.up()) is (state == "up")
    assert (first in p.targets("some-key")) is (state == "up")
    assert "no-such-pool" not in p.up()


def test_mark_reports_changes_only() -> None:
    p = _placement()
    assert not p.mark("n00-mem", healthy=True)
    assert p.mark("n00-mem", healthy=False)
    assert not p.mark("n00-mem", healthy=False)
    assert p.usable() == ["n01-mem", "n02-mem", "n03-mem"]


def test_reservations_count_as_used() -> None:
    p = _placement()
    _store(p, "a", 100, ["n00-mem", "n01-mem"])
    p.reserve(["n00-mem"], 50)
    assert p.used("n00-mem") == 150 and p.used("n01-mem") == 100
    p.reserve(["n00-mem"], -50)
    assert p.used("n00-mem") == 100


def test_victims_are_least_recently_used_unpinned_dram_objects() -> None:
    p = _placement(capacity=1000)
    for key in ("a", "b", "c", "d"):
        _store(p, key, 250, ["n00-mem", "n01-mem"])
    assert p.victims("n00-mem", 0) == []  # it fits already
    p.index.touch("a")  # a is now the most recently used
    assert [m.key for m in p.victims("n00-mem", 300)] == ["b", "c"]
    assert p.victims("n02-mem", 900) == []  # nothing held there
    p.index.get("b").pinned = True  # type: ignore[union-attr]
    p.index.get("c").tier = Tier.SSD  # type: ignore[union-attr]
    assert [m.key for m in p.victims("n00-mem", 300)] == ["d", "a"]


def test_victims_refuse_without_evicting_when_pinned_objects_fill_the_pool() -> None:
    p = _placement(capacity=1000)
    _store(p, "pinned", 800, ["n00-mem"], pinned=True)
    _store(p, "loose", 100, ["n00-mem"])
    with pytest.raises(CapacityError, match="pinned"):
        p.victims("n00-mem", 300)
    with pytest.raises(CapacityError):
        p.victims("n00-mem", 1001)  # more than the whole share
    assert [m.key for m in p.victims("n00-mem", 200)] == ["loose"]
    assert len(p.index) == 2  # choosing victims changes nothing


def test_a_reader_reads_its_own_nodes_copy_first_and_skips_dead_pools() -> None:
    p = _placement()
    meta = _store(p, "k", 10, ["n00-mem", "n02-mem", "n03-mem"])
    assert [pool for pool, _ in p.read_order(meta, "n02").copies] == [
        "n02-mem",
        "n00-mem",
        "n03-mem",
    ]
    assert next(pool for pool, _ in p.read_order(meta, None).copies) == "n00-mem"
    p.mark("n02-mem", healthy=False)
    plan = p.read_order(meta, "n02")
    assert [pool for pool, _ in plan.copies] == ["n00-mem", "n03-mem"]
    assert plan.down == ["n02-mem"]
    anywhere = p.read_order(meta, None)  # no reader's node: the copies in the order held
    assert [pool for pool, _ in anywhere.copies] == ["n00-mem", "n03-mem"]
    assert anywhere.down == ["n02-mem"]
    p.mark("n02-mem", healthy=True)
    assert p.read_order(meta, None).down == []


def test_the_repair_plan_restores_the_factor_from_a_live_copy() -> None:
    p = _placement()
    owners = p.ring.owners("k", 4)
    meta = _store(p, "k", 10, owners[:2])
    assert not p.needs_repair(meta)
    p.mark(owners[0], healthy=False)
    assert p.needs_repair(meta) and p.under_replicated() == [meta]
    plan = p.repair_plan(meta)
    assert plan.dead == [owners[0]]
    assert plan.source == owners[1]
    assert plan.targets == [owners[2]]  # the next healthy owner on the ring


def test_the_repair_plan_of_a_lost_object_has_no_source() -> None:
    p = _placement()
    meta = _store(p, "k", 10, ["n00-mem"])
    p.mark("n00-mem", healthy=False)
    plan = p.repair_plan(meta)
    assert (plan.dead, plan.source, plan.targets) == (["n00-mem"], None, [])


def test_fewer_pools_than_the_factor_want_fewer_copies() -> None:
    p = _placement(factor=3)
    for pool in ("n00-mem", "n01-mem", "n02-mem"):
        p.mark(pool, healthy=False)
    assert p.wanted() == 1
    meta = _store(p, "k", 10, ["n03-mem"])
    assert not p.needs_repair(meta)
    moved = _store(p, "ssd", 10, [])
    moved.tier = Tier.SSD
    assert not p.needs_repair(moved)  # the SSD tier keeps no DRAM copies


def test_a_silent_pool_is_suspect_then_dead_and_up_when_it_answers() -> None:
    from cmemu.emulator.model.ems import Health

    placement = Placement(
        pools={"a": "n00", "b": "n01"},
        ring=HashRing(["a", "b"], 8),
        capacity_per_pool=100,
        replication_factor=2,
        suspect_after_sweeps=2,
        dead_after_ns=10,
    )
    assert placement.observe("a", answered=False, now_ns=0) is None  # one miss: still up
    assert placement.observe("a", answered=False, now_ns=5) is Health.SUSPECT
    assert placement.usable() == ["b"]
    assert placement.observe("a", answered=False, now_ns=10) is Health.DEAD
    assert placement.observe("a", answered=True, now_ns=11) is Health.UP
    assert placement.suspect("b", 12) and placement.health["b"] is Health.SUSPECT
