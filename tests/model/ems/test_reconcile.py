"""Reconciling a pool's regions with the index: the newest generation wins, tombstones delete."""

from __future__ import annotations

from emulator.model.ems import (
    Index,
    Listed,
    ObjectMeta,
    Replica,
    chunk_crcs,
    decode_label,
    decode_trailer,
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

    from emulator.model.errors import DataLossError

    data = bytes(range(256)) * 40
    crcs = chunk_crcs(data, 4096)
    raw = encode_trailer(4096, crcs)
    assert decode_trailer(raw, zlib.crc32(raw), len(data)) == (4096, crcs)
    with pytest.raises(DataLossError):
        decode_trailer(raw, zlib.crc32(raw) ^ 1, len(data))


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
