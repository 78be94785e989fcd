"""The elastic memory store's core: keys, the hash ring, the object index, placement, figures.

No I/O here. The service (services/ems_store.py) moves the bytes over UB and keeps this in step.
"""

from __future__ import annotations

from emulator.model.ems.index import (
    LABEL_VERSION,
    PAGE_SIZE_DEFAULT,
    PAGE_SIZE_MAX,
    Index,
    ObjectMeta,
    Page,
    Replica,
    Tier,
    decode_label,
    encode_label,
)
from emulator.model.ems.keys import (
    KEY_MAX_BYTES,
    check_block_tokens,
    check_key,
    object_size,
    prefix_keys,
)
from emulator.model.ems.placement import REBUILD_POLL_S, Placement, ReadPlan, RepairPlan
from emulator.model.ems.ring import HashRing
from emulator.model.ems.stats import Counters, PoolStats, StoreStats, Timing, summarize

__all__ = [
    "KEY_MAX_BYTES",
    "LABEL_VERSION",
    "PAGE_SIZE_DEFAULT",
    "PAGE_SIZE_MAX",
    "REBUILD_POLL_S",
    "Counters",
    "HashRing",
    "Index",
    "ObjectMeta",
    "Page",
    "Placement",
    "PoolStats",
    "ReadPlan",
    "RepairPlan",
    "Replica",
    "StoreStats",
    "Tier",
    "Timing",
    "check_block_tokens",
    "check_key",
    "decode_label",
    "encode_label",
    "object_size",
    "prefix_keys",
    "summarize",
]
