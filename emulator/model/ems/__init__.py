"""The elastic memory store's core: keys, the hash ring, the object index, placement, figures.

No I/O here. The engine (emulator/engines/ems/) moves the bytes over UB and keeps this in step.
"""

from __future__ import annotations

from cmemu.emulator.model.ems.chunks import (
    TRAILER_HEAD_BYTES,
    chunk_crcs,
    decode_trailer,
    decode_trailer_head,
    encode_trailer,
    spans,
    trailer_bytes,
)
from cmemu.emulator.model.ems.index import (
    ABORT_VERSION,
    LABEL_VERSION,
    PAGE_SIZE_DEFAULT,
    PAGE_SIZE_MAX,
    TOMBSTONE_VERSION,
    Aborted,
    Index,
    ObjectMeta,
    Page,
    Replica,
    Tier,
    Tombstone,
    decode_abort,
    decode_label,
    decode_tombstone,
    encode_abort,
    encode_label,
    encode_tombstone,
)
from cmemu.emulator.model.ems.keys import (
    KEY_MAX_BYTES,
    KINDS,
    KV_BLOCK,
    check_block_tokens,
    check_key,
    check_kind,
    object_size,
    prefix_keys,
)
from cmemu.emulator.model.ems.placement import (
    REBUILD_POLL_S,
    Health,
    Placement,
    ReadPlan,
    RepairPlan,
)
from cmemu.emulator.model.ems.reconcile import (
    Listed,
    Reconciled,
    absorb_aborts,
    absorb_tombstones,
    reconcile,
)
from cmemu.emulator.model.ems.ring import HashRing
from cmemu.emulator.model.ems.stats import Counters, PoolStats, StoreStats, Timing, summarize

__all__ = [
    "ABORT_VERSION",
    "KEY_MAX_BYTES",
    "KINDS",
    "KV_BLOCK",
    "LABEL_VERSION",
    "PAGE_SIZE_DEFAULT",
    "PAGE_SIZE_MAX",
    "REBUILD_POLL_S",
    "TOMBSTONE_VERSION",
    "TRAILER_HEAD_BYTES",
    "Aborted",
    "Counters",
    "HashRing",
    "Health",
    "Index",
    "Listed",
    "ObjectMeta",
    "Page",
    "Placement",
    "PoolStats",
    "ReadPlan",
    "Reconciled",
    "RepairPlan",
    "Replica",
    "StoreStats",
    "Tier",
    "Timing",
    "Tombstone",
    "absorb_aborts",
    "absorb_tombstones",
    "check_block_tokens",
    "check_key",
    "check_kind",
    "chunk_crcs",
    "decode_abort",
    "decode_label",
    "decode_tombstone",
    "decode_trailer",
    "decode_trailer_head",
    "encode_abort",
    "encode_label",
    "encode_tombstone",
    "encode_trailer",
    "object_size",
    "prefix_keys",
    "reconcile",
    "spans",
    "summarize",
    "trailer_bytes",
]
