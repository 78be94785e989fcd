"""A pending queue of job requests: higher priority first, then first come, first served.

The Scheduler service refuses what does not fit (state.py says why); a caller that waits instead,
such as the allocation benchmark's replay, keeps its waiting requests here.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from cmemu.emulator.model.scheduler.jobs import JobRequest


class PendingQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, JobRequest]] = []
        self._seq = itertools.count()

    def push(self, request: JobRequest) -> None:
        heapq.heappush(self._heap, (-request.priority, next(self._seq), request))

    def head(self) -> JobRequest:
        return self._heap[0][2]

    def pop(self) -> JobRequest:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[JobRequest]:
        """In the order they would start."""
        return (entry[2] for entry in sorted(self._heap))
