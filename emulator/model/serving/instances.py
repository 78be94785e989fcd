"""The engine's bookkeeping: where each request is (`Stage`, `Tracked`), a step in flight
(`Step`), and the two kinds of instance: a decode instance's slots and HBM per die
(`DecodeInstance`), a prefill instance's queue (`PrefillInstance`)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from emulator.model.serving.placement import ExpertPlacement, Remap, remap
from emulator.model.serving.plans import Request, StepPlan
from emulator.model.serving.prefix import PrefixCache


class Stage(StrEnum):
    NEW = "new"
    LOOKUP = "lookup"
    QUEUED = "queued"
    PREFILL = "prefill"
    WAITING = "waiting"  # prefilled, waiting for a decode slot
    TRANSFER = "transfer"
    DECODE = "decode"


@dataclass
class Tracked:
    request: Request
    prefill: str
    stage: Stage = Stage.NEW
    matched_blocks: int = 0
    decode: str = ""
    slot: int = -1
    resume: int = 0  # output tokens emitted before its KV was lost: prefill continues from here
    retries: int = 0
    load_s: float = 0.0  # reading its matched blocks that are not in its prefill HBM from EMS


@dataclass
class Step:
    plan: StepPlan
    end_s: float | None = None
    batch: int = 0  # DECODE: the busiest die's requests
    kv: float = 0.0  # DECODE: mean context
    tokens: int = 0  # PREFILL: tokens computed
    pairs: float = 0.0  # PREFILL: causal attention pairs
    requests: int = 0  # PREFILL
    loaded: float = 0.0  # PREFILL: prefix KV bytes read from EMS
    load_s: float = 0.0  # PREFILL: reading them, the busiest die's share
    matched: int = 0  # LOOKUP
    dies: int = 0  # DECODE: the dies, EP degree and imbalance it is costed at
    ep: int = 0
    imbalance: float = 1.0
    failed: str = ""  # reported failed: why
    abandoned: bool = False  # its instance lost a die meanwhile: it ends with no effect


NO_DECODE = "no decode instance is in service (its dies are lost)"


class DecodeInstance:
    """A decode instance's slots: max_batch_per_die x dies, slot i on die i % dies. Per-request
    counters live in arrays so that a step over 15,000 requests is a few vector operations."""

    def __init__(
        self,
        name: str,
        dies: int,
        per_die: int,
        experts: ExpertPlacement,
        imbalance: float,
        *,
        kv_budget: float | None = None,
    ) -> None:
        self.name = name
        # HBM each die has for KV caches and activations (None: not enforced, see hbm.py)
        self.kv_budget = kv_budget
        self.dies = dies
        self.slots_per_die = per_die
        self.ep0 = len(experts.dies)  # the expert-parallel group: the first ep0 dies
        self.experts = experts  # over d0..d{ep0-1}
        self.imbalance0 = imbalance
        self.imbalance = imbalance
        self.remap: Remap | None = None
        self.lost: set[int] = set()
        n = dies * per_die
        self.ids: list[str] = [""] * n
        self.active = np.zeros(n, dtype=bool)  # in the batch
        self.emitted = np.zeros(n, dtype=np.int64)
        self.target = np.zeros(n, dtype=np.int64)
        self.context = np.zeros(n, dtype=np.int64)  # prompt tokens
        self.credit = np.zeros(n, dtype=np.float64)
        self.per_die = np.zeros(dies, dtype=np.int64)
        self.need = np.zeros(n, dtype=np.float64)  # HBM bytes each slot's request holds
        self.kv_used = np.zeros(dies, dtype=np.float64)
        self.kv_peak = 0.0  # the most HBM bytes one die's requests held
        # lowest level first, so that filling keeps the dies even
        self.free: list[int] = list(range(n))
        heapq.heapify(self.free)
        self.reserved = 0  # slots taken by transfers in flight or joined
        self.n_active = 0
        self.busy: int | None = None
        self.joining: list[int] = []

    @property
    def capacity(self) -> int:
        return len(self.ids) - len(self.lost) * self.slots_per_die

    @property
    def alive(self) -> int:
        return self.dies - len(self.lost)

    @property
    def ep(self) -> int:
        return self.ep0 - sum(1 for d in self.lost if d < self.ep0)

    def fits(self, need: float) -> bool:
        """Whether some die in service has a free slot and `need` bytes of HBM left."""
        if not self.free:
            return False
        if self.kv_budget is None:
            return True
        room = (self.per_die < self.slots_per_die) & (self.kv_used + need <= self.kv_budget)
        if self.lost:
            room[list(self.lost)] = False
        return bool(room.any())

    def take(self, need: float = 0.0) -> int:
        """The lowest free slot (so filling keeps the dies level) on a die with `need` bytes of
        HBM left: the caller checked `fits(need)`."""
        slot = self.free[0]
        die = slot % self.dies
        if self.kv_budget is None or self.kv_used[die] + need <= self.kv_budget:
            heapq.heappop(self.free)
        else:  # the lowest slot's die is full: the lowest slot on a die with room
            free = np.fromiter(self.free, dtype=np.int64, count=len(self.free))
            ok = self.kv_used[free % self.dies] + need <= self.kv_budget
            slot = int(free[ok].min())
            die = slot % self.dies
            self.free.remove(slot)
            heapq.heapify(self.free)
        self.reserved += 1
        self.per_die[die] += 1
        self.need[slot] = need
        self.kv_used[die] += need
        self.kv_peak = max(self.kv_peak, float(self.kv_used[die]))
        return slot

    def release(self, slot: int) -> None:
        if self.active[slot]:
            self.n_active -= 1
        self.active[slot] = False
        self.ids[slot] = ""
        self.per_die[slot % self.dies] -= 1
        self.kv_used[slot % self.dies] -= self.need[slot]
        self.need[slot] = 0.0
        self.reserved -= 1
        if slot % self.dies not in self.lost:
            heapq.heappush(self.free, slot)

    def lose(self, dies: Collection[int]) -> list[int]:
        """Take dies out: their free slots go, the slots held there are returned (to requeue)."""
        self.lost |= set(dies)
        self.free = [s for s in self.free if s % self.dies not in self.lost]
        heapq.heapify(self.free)
        held = [s for s in range(len(self.ids)) if self.ids[s] and s % self.dies in dies]
        self._remap()
        return held

    def regain(self, dies: Collection[int]) -> None:
        back = set(dies) & self.lost
        self.lost -= back
        for s in range(len(self.ids)):
            if s % self.dies in back and not self.ids[s]:
                heapq.heappush(self.free, s)
        self._remap()

    def _remap(self) -> None:
        lost = [f"d{d}" for d in sorted(self.lost) if d < self.ep0]
        if not lost or len(lost) == self.ep0:  # all lost: nothing runs here until restored
            self.remap, self.imbalance = None, self.imbalance0
        else:
            self.remap = remap(self.experts, lost)
            self.imbalance = max(1.0, self.remap.placement.imbalance)


@dataclass
class PrefillInstance:
    name: str
    cache: PrefixCache  # the prompt blocks its HBM holds after their prefill
    queue: deque[str] = field(default_factory=deque)
    queued_tokens: int = 0
    busy: int | None = None
    busy_tokens: int = 0  # the batch in flight's
    lost: set[int] = field(default_factory=set)  # isolated dies: no batches until restored
