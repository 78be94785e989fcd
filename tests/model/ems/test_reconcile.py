"""Reconciling a pool's regions with the index: the newest generation wins, tombstones delete."""

from __future__ import annotations

from cmemu.emulator.model.ems import (
    TRAILER_HEAD_BYTES,
    Aborted,
    Index,
    Listed,
    ObjectMeta,
    Replica,
    chunk_crcs,
    decode_abort,
    decode_label,
    decode_tombstone,
    decode_trailer,
    decode_trailer_head,
    encode_abort,
    encode_label,
    encode_tombstone,
    encode_trailer,
    reconcile,
)


def _meta(key: str, gen: int) -> ObjectMeta:
    return ObjectMeta(key=key, kind=1, size=10, crc=1, pinned=False, gen=gen)


def test_labels_carry_the_generation_and_old_labels_read_as_the_oldest() -> None:
    meta = _meta("k", 0x1234)
    meta.chunked = True
    back = decode_label(encode_label(meta))
    assert back is not None and (back.gen, back.chunked, back.crc) == (0x1234, True, 1)
    old = decode_label("ems1|2|1|10|00000001|k")
    assert old is not None and old.gen == 0 and old.key == "k"


def test_the_chunk_table_round_trips_and_refuses_a_bad_checksum() -> None:
    import zlib

    import pytest

    from cmemu.emulator.model.errors import DataLossError

    data = bytes(range(256)) * 40
    crcs = chunk_crcs(data, 4096)
    raw = encode_trailer(4096, crcs)
    assert decode_trailer(raw, zlib.crc32(raw), len(data)) == (4096, crcs)
    with pytest.raises(DataLossError):
        decode_trailer(raw, zlib.crc32(raw) ^ 1, len(data))
    # an object known only by its label: the head gives the chunk size, hence the table's length
    assert decode_trailer_head(raw[:TRAILER_HEAD_BYTES], len(data)) == 4096
    for bad in (raw[: TRAILER_HEAD_BYTES - 1], encode_trailer(0, ()), encode_trailer(1, crcs)):
        with pytest.raises(DataLossError):
            decode_trailer_head(bad[:TRAILER_HEAD_BYTES], len(data))


def test_reconcile_frees_deleted_and_superseded_copies_and_adopts_newer_ones() -> None:
    index = Index()
    kept = _meta("kept", 5)
    kept.replicas["b"] = Replica(7, 0)
    index.add(kept)
    newer = _meta("over", 9)
    newer.replicas["b"] = Replica(8, 0)
    index.add(newer)
    gone = _meta("lost", 3)
    gone.replicas["a"] = Replica(99, 0)  # the pool no longer has it
    index.add(gone)
    listed = [
        Listed(1, 0, encode_label(_meta("gone", 4))),
        Listed(2, 0, encode_tombstone("gone", 6)),
        Listed(3, 0, encode_label(_meta("over", 8))),  # older than the index's
        Listed(4, 0, encode_label(_meta("kept", 5))),  # known: re-attached
        Listed(5, 0, encode_label(_meta("fresh", 11))),  # unknown: adopted
        Listed(6, 0, "not ems"),
    ]
    done = reconcile(index, "a", listed, factor=2)
    assert sorted(done.free) == [1, 3]
    assert (done.attached, done.adopted, done.gone) == (1, 1, 1)
    assert set(kept.replicas) == {"a", "b"} and index.get("fresh") is not None
    assert index.tombstones["gone"].regions == {"a": 2}
    assert index.last_gen == 11 and index.next_gen() == 12


def test_abort_labels_round_trip_and_are_neither_copies_nor_tombstones() -> None:
    label = encode_abort("k", 0x1F, {"n01-mem", "n00-mem"})
    assert label == "ems2a|1f|n00-mem,n01-mem|k"
    found = decode_abort(label)
    assert found is not None and (found.key, found.gen, found.owed) == (
        "k",
        0x1F,
        {"n00-mem", "n01-mem"},
    )
    assert decode_label(label) is None and decode_tombstone(label) is None
    assert (
        decode_abort(encode_tombstone("k", 3)) is None
        and decode_abort(encode_label(_meta("k", 3))) is None
    )


def test_reconcile_frees_exactly_the_aborted_generation_of_a_key() -> None:
    """A put that failed at gen 5 left a copy on pool "a": that copy goes; the live gen 4
    copies stay, another key at gen 5 is adopted, and a later gen 6 of the key still wins."""
    index = Index()
    live = _meta("k", 4)
    live.replicas["b"] = Replica(7, 0)
    index.add(live)
    index.aborted[("k", 5)] = Aborted(key="k", gen=5, owed={"a", "c"}, pending={"a", "c"})
    listed = [
        Listed(1, 0, encode_label(_meta("k", 4))),  # the live version: re-attached
        Listed(2, 0, encode_label(_meta("k", 5))),  # the failed put's copy: freed
        Listed(3, 0, encode_label(_meta("j", 5))),  # another key at that generation: adopted
    ]
    done = reconcile(index, "a", listed, factor=2)
    assert done.free == [2] and (done.attached, done.adopted) == (1, 1)
    assert index.get("k") is live and set(live.replicas) == {"a", "b"}
    assert index.aborted[("k", 5)].pending == {"a", "c"}  # until the copy is freed
    index.settle("a")
    assert index.aborted[("k", 5)].pending == {"c"}
    listed = [
        Listed(4, 0, encode_label(_meta("k", 6))),  # newer than the aborted one: a later put
        Listed(5, 0, encode_label(_meta("k", 5))),
    ]
    done = reconcile(index, "c", listed, factor=2)
    assert done.free == [5] and done.adopted == 1 and done.superseded == [live]
    known = index.get("k")
    assert known is not None and known.gen == 6
    index.settle("c")
    assert not index.aborted[("k", 5)].pending


def test_abort_markers_are_learned_from_the_pools_and_undo_an_adopted_failed_put() -> None:
    """A restarted EMS learns the markers from their regions (owed by the listed pools that
    are not reconciled yet); a copy of an aborted generation adopted before its marker was seen
    leaves the index when the marker turns up."""
    index = Index()
    stray = _meta("k", 5)
    stray.replicas["b"] = Replica(9, 0)
    index.add(stray)  # adopted from "b" while the marker's pools were away
    listed = [
        Listed(1, 0, encode_abort("k", 5, {"b", "d"})),
        Listed(2, 0, encode_abort("k", 5, {"b", "d"})),  # a second region of one marker
    ]
    done = reconcile(index, "a", listed, factor=2, pending={"a", "b"})
    marker = index.aborted[("k", 5)]
    assert marker.pending == {"b"} and marker.owed == {"b", "d"}  # "d" was reconciled already
    assert marker.regions == {"a": 1} and done.free == [2]
    assert index.get("k") is None and done.superseded == [stray]
    assert index.last_gen == 5
