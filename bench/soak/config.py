"""The soak's sizes, timeouts and paths, in one place so that the load, the ledger, the
verification and the report agree on them; and the size distribution every load kind draws from."""

from __future__ import annotations

import math
import random

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import DeviceKind

KIB, MIB, GIB = 2**10, 2**20, 2**30
U64 = 2**64
INLINE_MAX = DEFAULT_PROFILE.limits.inline_payload_max_bytes  # one Put / one UB read or write
CHUNK = DEFAULT_PROFILE.ems.chunk_bytes  # PutStream pieces
DEAD_AFTER_S = DEFAULT_PROFILE.ems.dead_after_s  # time_scale 1: emulated seconds = wall seconds
CALL_TIMEOUT_S = 60.0  # any answer slower than this is a hang: DEADLINE_EXCEEDED, counted
STREAM_TIMEOUT_S = 180.0
SAMPLE_EVERY_S = 2.0
RSS_WINDOW_S = 10.0  # the warm and end figures are medians of the samples over this long
KEY_PREFIX = "soak/"
CHURN_LABEL = "soak-churn"
MAX_POSSIBLE = 6  # possible values kept per key or word before it counts as unknown
HISTORY_PER_KEY = 40

# the data the server holds for the ledger, allocated before the clock starts
DATA_REGIONS = {DeviceKind.NPU: 32, DeviceKind.CPU: 8, DeviceKind.MEMPOOL: 8}
DATA_REGION_BYTES = 512 * KIB
COUNTER_REGIONS, WORDS_PER_REGION = 8, 8
BULK_REGIONS, BULK_REGION_BYTES = 8, 8 * GIB
CHURN_DEVICES = 32
# An all-to-all with distinct per-pair sizes costs the fabric one max-min recomputation per flow
# completion: about flows squared. Over 64 dies (4,032 flows) that is ~19 s of CPU, during which
# the whole cm384 process answers about one call a second (reported as a finding); over 16 dies,
# 0.1 s. The soak keeps the per-pair form to 16 dies so that the rest of the load goes on.
PAIR_MAX_DIES = 16


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high], uniform in its logarithm: many small sizes, some large."""
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


def warm_up_s(seconds: float) -> float:
    """The warm-up of a run of `seconds`: 10% of it, at most 60 s (the run and the plot agree)."""
    return min(0.1 * seconds, 60.0)
