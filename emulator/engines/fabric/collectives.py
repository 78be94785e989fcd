"""Collectives timed whole on the fabric's own threads, with the timings of repeated ones kept.

A collective is CPU-bound (up to millions of flows): it runs on threads of its own, so that it
never starves the default pool other work uses, and at most `collective_queue_max` wait for one;
beyond that, RESOURCE_EXHAUSTED. A timing depends only on the ranks, the request and the link
graph's live state (faults), not on the transfers in flight: one computed at the graph's present
version is reused (a decode loop repeats its dispatch and combine every step).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.collectives import CollectiveTiming, run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.emulator.model.endpoints import Endpoint
from cmemu.emulator.model.errors import RETRY_AFTER_S, CapacityError
from cmemu.emulator.model.linkgraph import LinkGraph

# at most this many timings kept, holding at most this many flows together (about 40 bytes each)
MEMO_ENTRIES = 16
MEMO_FLOWS = 1_000_000
MemoKey = tuple[int, tuple[str, ...], CollectiveSpec]  # graph version, rank names, request


class Collectives:
    def __init__(self, graph: LinkGraph, limits: EmulatorLimits) -> None:
        self.graph = graph
        self.limits = limits
        self._pool = ThreadPoolExecutor(
            max_workers=limits.collective_workers, thread_name_prefix="collective"
        )
        self.pending = 0  # being timed or waiting for a worker (at most workers + queue_max)
        self._memo: OrderedDict[MemoKey, CollectiveTiming] = OrderedDict()
        self.memo_hits = 0
        # bytes every trunk carried for collectives (transfers are the flow clock's)
        self.carried: npt.NDArray[np.float64] = np.zeros(len(graph.trunk_names))

    async def time(self, ranks: list[Endpoint], spec: CollectiveSpec) -> CollectiveTiming:
        key = (self.graph.version, tuple(e.name for e in ranks), spec)
        known = self._memo.get(key)
        if known is not None:
            self._memo.move_to_end(key)
            self.memo_hits += 1
            return known
        timing = await self._compute(ranks, spec)
        if self.graph.version == key[0]:  # no fault landed meanwhile
            self._remember(key, timing)
        return timing

    def _remember(self, key: MemoKey, timing: CollectiveTiming) -> None:
        for stale in [k for k in self._memo if k[0] != key[0]]:
            del self._memo[stale]
        if timing.flows > MEMO_FLOWS:
            return
        self._memo[key] = timing
        while len(self._memo) > MEMO_ENTRIES or (
            sum(t.flows for t in self._memo.values()) > MEMO_FLOWS
        ):
            self._memo.popitem(last=False)  # the least recently used

    async def _compute(self, ranks: list[Endpoint], spec: CollectiveSpec) -> CollectiveTiming:
        bound = self.limits.collective_workers + self.limits.collective_queue_max
        if self.pending >= bound:
            full = CapacityError(
                "collectives in progress or waiting",
                requested=self.pending + 1,
                free=0,
                unit="collectives",
                reason="COLLECTIVE_QUEUE_FULL",
            )
            full.annotate(retry_after_s=RETRY_AFTER_S)
            raise full
        self.pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, run_collective, self.graph, ranks, spec)
        finally:
            self.pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
