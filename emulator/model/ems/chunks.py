"""Objects larger than one chunk: a CRC-32 per chunk, kept in a table after the data in every
copy (the region label has no room for it; the label holds the table's own CRC-32)."""

from __future__ import annotations

import struct
import zlib

from cmemu.emulator.model.errors import DataLossError

_HEAD = struct.Struct("<II")  # chunk bytes, chunk count
TRAILER_HEAD_BYTES = _HEAD.size


def spans(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, length) of each chunk of an object of `size` bytes."""
    return [(start, min(chunk_bytes, size - start)) for start in range(0, size, chunk_bytes)]


def chunk_crcs(data: bytes, chunk_bytes: int) -> tuple[int, ...]:
    view = memoryview(data)
    return tuple(zlib.crc32(view[s : s + n]) for s, n in spans(len(data), chunk_bytes))


def trailer_bytes(size: int, chunk_bytes: int) -> int:
    return _HEAD.size + 4 * len(spans(size, chunk_bytes))


def encode_trailer(chunk_bytes: int, crcs: tuple[int, ...]) -> bytes:
    return _HEAD.pack(chunk_bytes, len(crcs)) + struct.pack(f"<{len(crcs)}I", *crcs)


def decode_trailer(raw: bytes, crc: int | None, size: int) -> tuple[int, tuple[int, ...]]:
    """The chunk size and table of a copy's trailer, checked against the label's CRC-32."""
    if crc is None or zlib.crc32(raw) != crc or len(raw) < _HEAD.size:
        raise DataLossError("the chunk table fails its checksum")
    chunk_bytes, count = _HEAD.unpack_from(raw)
    if (
        not chunk_bytes
        or len(raw) != _HEAD.size + 4 * count
        or count != len(spans(size, chunk_bytes))
    ):
        raise DataLossError("the chunk table does not match the object")
    return chunk_bytes, struct.unpack_from(f"<{count}I", raw, _HEAD.size)


def decode_trailer_head(raw: bytes, size: int) -> int:
    """The chunk size a copy's trailer declares in its first TRAILER_HEAD_BYTES: how long the
    table is, for an object whose chunk size is not known yet (one rebuilt from its labels)."""
    if len(raw) != _HEAD.size:
        raise DataLossError("the chunk table's head is cut short")
    chunk_bytes, count = _HEAD.unpack(raw)
    if not chunk_bytes or count != -(-size // chunk_bytes):
        raise DataLossError("the chunk table does not match the object")
    return int(chunk_bytes)
