"""What a key and an object may be, and the prefix keys of a token sequence (a hash chain)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from cmemu.emulator.model.errors import InvalidArgumentError, OutOfRangeError
from cmemu.emulator.model.hardware import EmsProfile

KEY_MAX_BYTES = 200  # the region label holds the key: 256 characters in all
KINDS = (0, 1, 2, 3)  # cmemu.v1.ObjectKind: unspecified (a KV block), KV block, weights, checkpoint
KV_BLOCK = 1  # the kind an unspecified one is stored as


def check_key(key: str) -> None:
    """Every put and get checks its key: no generator, and no encoding of a key too short to
    pass the limit in UTF-8 (at most 4 bytes a character)."""
    if not key:
        raise InvalidArgumentError("key must not be empty")
    if len(key) > KEY_MAX_BYTES // 4 and len(key.encode()) > KEY_MAX_BYTES:
        raise InvalidArgumentError(f"key longer than {KEY_MAX_BYTES} bytes")
    if "|" in key or "\n" in key:
        raise InvalidArgumentError("key must not contain '|' or a newline")


def check_kind(kind: int) -> None:
    if kind not in KINDS:
        raise InvalidArgumentError(
            f"kind must be one of {', '.join(map(str, KINDS))} (ObjectKind), got {kind}",
            field="kind",
        )


def object_size(data_bytes: int, size: int, ems: EmsProfile, *, streamed: bool = False) -> int:
    """The size of an object put with `data_bytes` of real data or, when that is 0, a size-only
    `size`; refuses what the store does not take. A unary Put carries at most one chunk of real
    bytes; PutStream (`streamed`) up to real_object_max_bytes."""
    if data_bytes:
        if data_bytes > ems.real_object_max_bytes:
            raise InvalidArgumentError(
                f"objects over {ems.real_object_max_bytes} bytes are size-only: send size",
                field="data",
            )
        if not streamed and data_bytes > ems.chunk_bytes:
            raise InvalidArgumentError(
                f"a Put carries at most {ems.chunk_bytes} bytes: send larger objects by "
                "PutStream (or size-only)",
                field="data",
            )
        if size not in (0, data_bytes):
            raise InvalidArgumentError("size differs from len(data)", field="size")
    elif not size:
        raise InvalidArgumentError("an object needs data or a size", field="size")
    size = data_bytes or size
    if size > ems.object_max_bytes:
        raise InvalidArgumentError(
            f"oversize object: {size} bytes, at most {ems.object_max_bytes}", field="size"
        )
    return size


def check_block_tokens(block_tokens: int, low: int, high: int) -> None:
    if not low <= block_tokens <= high:
        raise OutOfRangeError(f"block_tokens must be {low} to {high}, got {block_tokens}")


def prefix_keys(tokens: Sequence[int], block_tokens: int, namespace: str = "") -> list[str]:
    """One key per full block; block i's key hashes every token of blocks 0..i (a chain), so two
    sequences share block keys exactly as long as they share a prefix."""
    keys = []
    digest = hashlib.sha256(f"cmemu-prefix|{namespace}|{block_tokens}".encode()).digest()
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = struct.pack(f"<{block_tokens}I", *tokens[start : start + block_tokens])
        digest = hashlib.sha256(digest + block).digest()
        keys.append(f"kv-{digest.hex()[:40]}")
    return keys
