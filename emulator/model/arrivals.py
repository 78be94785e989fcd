"""When each rank of a collective was ready to enter it: the fabric's record, read by the manager.

A synchronous collective waits for its last rank. Every rank runs its share of the collective's
per-phase software work on its own cores before it can take part (emulator/model/collectives.py
`overhead_s`); a rank whose cores are slowed (a `slow` fault's or a thermal throttle's compute
share) is ready `overhead / share` after the issue, and the fabric already makes the whole
collective wait for the slowest (engines/fabric/engine.py). The fabric keeps these ready instants
for its recent collectives so that a controller can see which rank arrives last, as HCCL's
per-rank wait times show a real cluster's slow card; the straggler judge
(emulator/model/manager/straggler.py) reads them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Arrival:
    """When each rank of one collective was ready: what a controller reads to find the late one."""

    seq: int  # 1, 2, ... in the order the fabric timed them
    op: str
    issue_ns: int  # emulated: when the collective was issued
    ranks: tuple[str, ...]  # die ids, in the request's order
    # per rank, emulated ns after `issue_ns` when it was ready; () when every rank was ready at
    # the same instant (no rank slowed: the common case, kept small)
    ready_ns: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ArrivalBatch:
    """The arrivals after a reader's last sequence number, and how many it missed."""

    arrivals: tuple[Arrival, ...]
    last_seq: int  # the latest collective's seq (0: none yet): the next read's `after_seq`
    dropped: int = 0  # arrivals after `after_seq` no longer kept (the reader fell behind)


class ArrivalLog:
    """The most recent `keep` arrivals, read by sequence number."""

    def __init__(self, keep: int) -> None:
        self._kept: deque[Arrival] = deque(maxlen=max(1, keep))
        self.seq = 0

    def add(
        self, *, op: str, issue_ns: int, ranks: tuple[str, ...], ready_ns: tuple[int, ...]
    ) -> None:
        self.seq += 1
        self._kept.append(
            Arrival(seq=self.seq, op=op, issue_ns=issue_ns, ranks=ranks, ready_ns=ready_ns)
        )

    def since(self, after_seq: int, limit: int = 0) -> ArrivalBatch:
        """The arrivals after `after_seq`, oldest first, at most `limit` of them (0: all kept).
        An `after_seq` past the latest (the reader knew a fabric that has since restarted) reads
        from the start."""
        if after_seq > self.seq:
            after_seq = 0
        first = self.seq - len(self._kept) + 1  # the oldest kept
        dropped = max(0, first - after_seq - 1) if self._kept else 0
        out = list(self._kept)[max(0, after_seq + 1 - first) :]
        if limit > 0:
            out = out[:limit]
        last = out[-1].seq if out else after_seq
        return ArrivalBatch(arrivals=tuple(out), last_seq=last, dropped=dropped)
