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
import numpy.typing as npt

from cmemu.emulator.model.serving.placement import ExpertPlacement, Remap, remap
from cmemu.emulator.model.serving.plans import Request, StepPlan
from cmemu.emulator.model.serving.prefix import PrefixCache


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
NONE = np.iinfo(np.int64).max  # a die with no free slot


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
        self.admitted = np.zeros(n, dtype=np.int64)  # order of joining: the newest preempted first
        self._joins = 0
        self.kv_used = np.zeros(dies, dtype=np.float64)
        self.kv_peak = 0.0  # the most HBM bytes one die's requests held
        # each die's free slots, lowest level first, and each die's lowest free slot (NONE: no
        # free slot): the lowest of them is taken, so that filling keeps the dies even
        self._free: list[list[int]] = [list(range(d, n, dies)) for d in range(dies)]
        self._lowest = np.arange(dies, dtype=np.int64)
        self.reserved = 0  # slots taken by transfers in flight or joined
        self.n_active = 0
        self.busy: int | None = None
        self.joining: list[int] = []
        self.retiring = False  # changing role (roles.py): takes no new request, finishes its own

    @property
    def capacity(self) -> int:
        return len(self.ids) - len(self.lost) * self.slots_per_die

    @property
    def alive(self) -> int:
        return self.dies - len(self.lost)

    @property
    def ep(self) -> int:
        return self.ep0 - sum(1 for d in self.lost if d < self.ep0)

    def fits(self, need: float, headroom: float = 0.0) -> bool:
        """Whether some die in service has a free slot and `need` bytes of HBM left (and
        `headroom` more beside them)."""
        return bool(self._room(need, headroom).any())

    def _room(self, need: float, headroom: float) -> npt.NDArray[np.bool_]:
        """Per die: a free slot, and the HBM for `need` and `headroom` beside what it holds."""
        room: npt.NDArray[np.bool_] = self._lowest != NONE
        if self.kv_budget is not None:
            room &= self.kv_used + need + headroom <= self.kv_budget
        return room

    def take(self, need: float = 0.0, headroom: float = 0.0) -> int:
        """The lowest free slot (so filling keeps the dies level) on a die with `need` bytes of
        HBM left and `headroom` beside them: the caller checked `fits(need, headroom)`."""
        die = int(self._lowest.argmin())  # the lowest free slot's die, when it has the room
        budget = self.kv_budget
        if budget is not None and self.kv_used[die] + need + headroom > budget:
            die = int(np.where(self._room(need, headroom), self._lowest, NONE).argmin())
        slot = heapq.heappop(self._free[die])
        self._lowest[die] = self._free[die][0] if self._free[die] else NONE
        self.reserved += 1
        self.per_die[die] += 1
        self._joins += 1
        self.admitted[slot] = self._joins
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
            self._give_back(slot)

    def _give_back(self, slot: int) -> None:
        die = slot % self.dies
        heapq.heappush(self._free[die], slot)
        self._lowest[die] = self._free[die][0]

    def grow(self, need: np.ndarray) -> list[int]:
        """On-demand admission: each slot now holds `need` bytes (its context so far and the next
        step's tokens). The slots to preempt so that every die fits its budget again: on each
        die over it, its newest requests first (as vLLM preempts), never one of those still
        joining (their KV is on its way). Their bytes stay counted until the caller releases
        them."""
        self.need[:] = need
        dies = np.arange(len(self.need)) % self.dies
        self.kv_used = np.bincount(dies, weights=self.need, minlength=self.dies).astype(np.float64)
        if self.kv_budget is None:
            return []
        over = self.kv_used - self.kv_budget  # per die: what must go (> 0)
        if not (over > 0).any():
            return []
        slots = np.flatnonzero(self.active & (over[dies] > 0))
        if slots.size == 0:  # only requests still joining there: they wait their turn
            return []
        slots = slots[np.lexsort((-self.admitted[slots], slots % self.dies))]  # die, newest
        die = slots % self.dies
        held = np.cumsum(self.need[slots])
        starts = np.r_[0, np.flatnonzero(np.diff(die)) + 1]  # each die's first in `slots`
        before = held - self.need[slots]  # what the newer ones of its die free up
        before -= np.repeat(before[starts], np.diff(np.r_[starts, slots.size]))
        victims: list[int] = slots[before < over[die]].tolist()
        return victims

    def lose(self, dies: Collection[int]) -> list[int]:
        """Take dies out: their free slots go, the slots held there are returned (to requeue)."""
        self.lost |= set(dies)
        for die in dies:
            self._free[die] = []
            self._lowest[die] = NONE
        held = [s for s in range(len(self.ids)) if self.ids[s] and s % self.dies in dies]
        self._remap()
        return held

    def regain(self, dies: Collection[int]) -> None:
        back = set(dies) & self.lost
        self.lost -= back
        for s in range(len(self.ids)):
            if s % self.dies in back and not self.ids[s]:
                self._give_back(s)
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
    retiring: bool = False  # changing role (roles.py): takes no new prompt, finishes its own

    @property
    def taking(self) -> bool:
        """Whether new prompts may be routed here."""
        return not self.lost and not self.retiring
