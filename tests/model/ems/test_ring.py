"""The ring's owners (emulator/model/ems/ring.py) stop walking once they have the copies wanted:
the same pools, in the same order, as the whole walk filtered (what a Put's placement asked
before); the twin: a walk that stops early must still skip the pools that are not usable."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.ems import HashRing

POOLS = [f"n{n:02d}-mem" for n in range(48)]


def _whole_walk(ring: HashRing, key: str, count: int, usable: set[str]) -> list[str]:
    return [p for p in ring.walk(key) if p in usable][:count]


@pytest.mark.parametrize("count", [0, 1, 2, 3, 48, 60])
def test_owners_are_the_whole_walks_first_usable_pools(count: int) -> None:
    ring = HashRing(POOLS, 64)
    usable = set(POOLS[::3])
    for i in range(200):
        key = f"key-{i}"
        assert ring.owners(key, count, usable=usable) == _whole_walk(ring, key, count, usable)
        assert ring.owners(key, count) == _whole_walk(ring, key, count, set(POOLS))


def test_owners_never_name_a_pool_that_is_not_usable() -> None:
    ring = HashRing(POOLS, 64)
    first = ring.owners("k", 1)[0]
    usable = [p for p in POOLS if p != first]
    owners = ring.owners("k", 2, usable=usable)
    assert first not in owners and len(owners) == 2
    assert owners[0] == ring.owners("k", 2)[1]  # the next pool of the walk takes its place
