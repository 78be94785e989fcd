"""Straggler (slow-device) detection: the NPU that arrives last at collectives, consistently and by
a margin.

A gray failure (a `slow` NPU, a thermally throttled node) answers every heartbeat: liveness cannot
see it. Its workload can: a synchronous collective waits for its last rank, so a rank whose cores
run slow enters every collective it takes part in later than its peers, while a one-off late
arrival does not repeat. Large training clusters find slow cards that way (the rank that waits
least in its collectives is the slow one). The fabric records when each rank of each collective
was ready (emulator/model/arrivals.py); this judge reads those records:

- per collective, an NPU's lag is the ready time of its latest die over the collective's
  reference, the lower median of every rank's ready time (with two ranks, the faster one);
- an NPU is a straggler when its last `samples` collectives (each within the last `window_s`)
  number `samples` and at least `consistency` of them lagged by `lag_ratio` or more.

So too few collectives, a one-off late arrival, or jitter under the margin flag nothing. What it
cannot see, by construction: a slowed NPU that takes part in no collective (no workload on it:
nothing is degraded), and a collective where most ranks are equally slow (no peer to be late
against, as for any relative detector). The figures are HardwareProfile.manager's straggler_*.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from cmemu.emulator.model.arrivals import Arrival
from cmemu.emulator.model.hardware import ManagerProfile
from cmemu.emulator.model.naming import device_of


@dataclass(frozen=True, kw_only=True)
class StragglerSettings:
    """How late, how often and over how long an NPU must lag to be judged a straggler."""

    lag_ratio: float
    samples: int
    consistency: float
    window_s: float

    @classmethod
    def of(cls, m: ManagerProfile) -> StragglerSettings:
        return cls(
            lag_ratio=m.straggler_lag_ratio,
            samples=m.straggler_samples,
            consistency=m.straggler_consistency,
            window_s=m.straggler_window_s,
        )


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """An NPU found consistently late in collectives, and by how much."""

    npu: str
    samples: int  # collectives judged
    late: int  # of them, those it lagged in by the margin
    ratio: float  # its median lag over those it was late in
    since_ns: int  # the first of those collectives: when the slowdown showed (its fault_ns)

    @property
    def detail(self) -> str:
        return (
            f"straggler: ready {self.ratio:.1f}x as late as the median rank in {self.late} of "
            f"its last {self.samples} collectives"
        )


@dataclass(frozen=True)
class _Sample:
    """One collective's lag of an NPU, at an emulated instant."""

    at_ns: int
    ratio: float


@dataclass
class StragglerJudge:
    """Judges stragglers from collectives' arrivals, over a window of samples per NPU."""

    settings: StragglerSettings
    _samples: dict[str, deque[_Sample]] = field(default_factory=dict)
    _npu: dict[str, str] = field(default_factory=dict)  # die id -> NPU id, parsed once

    def observe(self, arrival: Arrival) -> None:
        """One collective's arrivals: a sample for every NPU among its ranks."""
        lags = self._lags(arrival)
        for npu, ratio in lags.items():
            kept = self._samples.get(npu)
            if kept is None:
                kept = self._samples[npu] = deque(maxlen=max(1, self.settings.samples))
            kept.append(_Sample(arrival.issue_ns, ratio))

    def _lags(self, arrival: Arrival) -> dict[str, float]:
        npus = [self._npu_of(rank) for rank in arrival.ranks]
        if not arrival.ready_ns:  # every rank ready at once
            return dict.fromkeys(npus, 1.0)
        ready = arrival.ready_ns
        reference = sorted(ready)[(len(ready) - 1) // 2]
        lags: dict[str, float] = {}
        for npu, at in zip(npus, ready, strict=True):
            ratio = at / reference if reference > 0 else (1.0 if at <= 0 else float("inf"))
            lags[npu] = max(lags.get(npu, 0.0), ratio)
        return lags

    def _npu_of(self, rank: str) -> str:
        npu = self._npu.get(rank)
        if npu is None:
            npu = self._npu[rank] = device_of(rank)
        return npu

    def stragglers(self, now_ns: int) -> list[Straggler]:
        """Every NPU judged a straggler now (older samples than the window are dropped)."""
        s = self.settings
        horizon = now_ns - round(s.window_s * 1e9)
        out = []
        for npu, kept in list(self._samples.items()):
            while kept and kept[0].at_ns < horizon:
                kept.popleft()
            if not kept:
                del self._samples[npu]
                continue
            if len(kept) < s.samples:
                continue
            late = [x for x in kept if x.ratio >= s.lag_ratio]
            if late and len(late) >= s.consistency * len(kept):
                out.append(
                    Straggler(
                        npu=npu,
                        samples=len(kept),
                        late=len(late),
                        ratio=statistics.median(x.ratio for x in late),
                        since_ns=late[0].at_ns,
                    )
                )
        return out

    def forget(self, npu: str) -> None:
        """Drop an NPU's samples: it is judged anew (back in service after a repair)."""
        self._samples.pop(npu, None)

    def samples(self, npu: str) -> int:
        return len(self._samples.get(npu, ()))
