"""The object index: labels, LRU order, listing by pages; the request checks of keys."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.costmodel import ems_ssd_ns
from cmemu.emulator.model.ems import (
    PAGE_SIZE_MAX,
    Counters,
    HashRing,
    Index,
    ObjectMeta,
    Placement,
    Replica,
    Timing,
    decode_label,
    encode_label,
    object_size,
    summarize,
)
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE


def _meta(key: str, size: int = 10) -> ObjectMeta:
    return ObjectMeta(key=key, kind=2, size=size, crc=0xDEADBEEF, pinned=True)


def test_the_label_carries_the_metadata() -> None:
    meta = _meta("weights.shard-4")
    back = decode_label(encode_label(meta))
    assert back is not None
    assert (back.key, back.kind, back.size, back.crc, back.pinned) == (
        "weights.shard-4",
        2,
        10,
        0xDEADBEEF,
        True,
    )
    assert decode_label("not ems") is None


def _index(keys: list[str]) -> Index:
    index = Index()
    for key in keys:
        index.add(_meta(key))
    return index


def test_pages_walk_every_matching_key_once_in_order() -> None:
    index = _index([f"kv-{i:03d}" for i in range(25)] + ["weights-a", "kw"])
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = index.page(prefix="kv-", page_size=10, token=token)
        seen += [m.key for m in page.objects]
        pages += 1
        token = page.next_token
        if not token:
            break
    assert seen == [f"kv-{i:03d}" for i in range(25)] and pages == 3
    assert [m.key for m in index.page().objects][-2:] == ["kw", "weights-a"]


def test_page_size_defaults_and_is_capped() -> None:
    index = _index([f"k{i:05d}" for i in range(PAGE_SIZE_MAX + 5)])
    assert len(index.page().objects) == 1000
    capped = index.page(page_size=PAGE_SIZE_MAX + 1000)
    assert len(capped.objects) == PAGE_SIZE_MAX and capped.next_token


def test_a_page_token_survives_deletes_and_refuses_forgery() -> None:
    index = _index(["a", "b", "c", "d"])
    first = index.page(page_size=2)
    index.remove("b")
    index.remove("c")  # the next page starts after the last key returned, even if it is gone
    assert [m.key for m in index.page(page_size=2, token=first.next_token).objects] == ["d"]
    for bad in ("garbage!", "Zm9v", first.next_token + "x"):
        with pytest.raises(InvalidArgumentError):
            index.page(token=bad)
    with pytest.raises(InvalidArgumentError):  # a token of another prefix
        index.page(prefix="z", token=first.next_token)


def test_object_size_checks_data_and_size() -> None:
    ems = DEFAULT_PROFILE.ems
    assert object_size(5, 0, ems) == 5
    assert object_size(0, 1 << 30, ems) == 1 << 30
    for data, size in ((5, 6), (0, 0), (ems.real_object_max_bytes + 1, 0)):
        with pytest.raises(InvalidArgumentError):
            object_size(data, size, ems)
    with pytest.raises(InvalidArgumentError, match="oversize"):
        object_size(0, ems.object_max_bytes + 1, ems)


def test_timing_of_parallel_copies() -> None:
    timing = Timing()
    timing.add(100, 300)
    timing.add(90, 200)
    assert (timing.issue_ns, timing.complete_ns) == (90, 290)


def test_summary_counts_copies_per_pool() -> None:
    pools = {"n00-mem": "n00", "n01-mem": "n01"}
    p = Placement(
        pools=pools, ring=HashRing(list(pools), 8), capacity_per_pool=100, replication_factor=2
    )
    meta = _meta("k", 30)
    meta.replicas = {"n00-mem": Replica(1, 0), "n01-mem": Replica(1, 0)}
    p.index.add(meta)
    s = summarize(p, Counters(hits=3), ssd_used_bytes=0, ssd_capacity_bytes=5)
    assert (s.objects, s.dram_bytes, s.dram_used_bytes, s.dram_capacity_bytes) == (1, 30, 60, 200)
    assert s.counters.hits == 3 and s.under_replicated == 0
    one = summarize(p, Counters(), ssd_used_bytes=0, ssd_capacity_bytes=5, pool_filter="n01-mem")
    assert [(x.pool, x.objects, x.bytes) for x in one.pools] == [("n01-mem", 1, 30)]
    with pytest.raises(NotFoundError):
        summarize(p, Counters(), ssd_used_bytes=0, ssd_capacity_bytes=5, pool_filter="n09-mem")


def test_ssd_cost_is_latency_plus_bandwidth() -> None:
    ems = DEFAULT_PROFILE.ems
    assert ems_ssd_ns(0) == round(ems.ssd_latency_s * 1e9)
    one_gb = ems_ssd_ns(10**9) - ems_ssd_ns(0)
    assert one_gb == pytest.approx(10**9 / ems.ssd_bytes_per_s_per_node * 1e9)
    with pytest.raises(InvalidArgumentError):
        ems_ssd_ns(-1)
