"""An EMS object as a caller stores and reads it: its kind, and what a put or a read cost.
Plain values, so that the typed client returns them and an engine (a training job's
checkpoints: emulator/engines/training/; a serving deployment's prefix lookups:
emulator/engines/serving/) uses them without knowing the wire."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ObjectKind(enum.StrEnum):
    KV = "kv"
    WEIGHTS = "weights"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True, kw_only=True)
class Put:
    """A stored object: where its copies are and what storing it cost in emulated time."""

    key: str
    size: int
    replicas: tuple[str, ...]
    issue_ns: int
    complete_ns: int
    evicted: int  # objects evicted (to SSD or out) to make room


@dataclass(frozen=True, kw_only=True)
class Got:
    """A read object: its bytes (empty for a size-only object, or when not kept) and timing."""

    key: str
    data: bytes
    size: int
    served_by: str  # the pool (or "ssd") whose copy served the last chunk
    issue_ns: int
    complete_ns: int


@dataclass(frozen=True, kw_only=True)
class PrefixMatch:
    """How much of a prompt's prefix EMS holds the KV blocks of."""

    matched_blocks: int
    matched_tokens: int
    keys: tuple[str, ...]  # the matched blocks'
