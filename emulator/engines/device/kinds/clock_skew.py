"""clock-skew: the clock of a device's process (its host) reads wrong, by a step `offset_s`
(positive ahead, negative behind) and a rate error `drift_ppm`, until cleared. One fault per
process: a second device of a skewed process is refused (FAILED_PRECONDITION
FAULT_ALREADY_ACTIVE).

"One process" is whoever shares the device's LocalClock (engines/skewclock.py), which the
launcher decides: in procs and compose mode, every device of the device's OS process (a node, or
one device with `--per device`), and its liveness beats, since they are one host with one clock;
in process, where the one process owns emulated time and a skew of it would move the whole
emulator with it (nothing would read wrong against anything), the device alone, as the host it
would be on its own.

Its effects are those of a real host's wrong clock: every stamp the process gives out (events,
telemetry, liveness beats, faults' since/until, kernels' and UB transactions' issue stamps) is
off by the skew; a duration the process keeps as an instant to reach (another fault's until) ends
early by a step ahead and late by a step behind; and the control plane must not take the wrong
time for a fault (the manager judges silence on its own receive time). The skew's own duration
(`--for`) is counted on the skewed clock from the moment it lands. Clearing it steps the clock
back to the true time (a second step, which again moves what the process keeps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind
from cmemu.emulator.engines.skewclock import LocalClock
from cmemu.emulator.model.clock import Skew
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.faults.params import invalid, param
from cmemu.emulator.model.hardware import DEFAULT_PROFILE

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "clock-skew"


@dataclass(frozen=True, kw_only=True)
class ClockSkewParams:
    offset_s: float = param(
        0.0, "emulated seconds the process's clock reads off: positive ahead, negative behind"
    )
    drift_ppm: float = param(
        0.0, "its rate error from the injection on, parts per million: positive runs fast"
    )

    def check(self) -> None:
        limits = DEFAULT_PROFILE.limits
        if abs(self.offset_s) > limits.clock_skew_max_s:
            raise invalid(
                NAME,
                "offset_s",
                f"must be within +-{limits.clock_skew_max_s:g} s, got {self.offset_s:g}",
            )
        if abs(self.drift_ppm) > limits.clock_drift_max_ppm:
            raise invalid(
                NAME,
                "drift_ppm",
                f"must be within +-{limits.clock_drift_max_ppm:g} ppm, got {self.drift_ppm:g}",
            )
        if self.offset_s == 0 and self.drift_ppm == 0:
            raise invalid(NAME, "offset_s", "or drift_ppm must be set (nothing would skew)")


def local_clock(engine: DeviceEngine) -> LocalClock:
    clock = engine.clock
    if not isinstance(clock, LocalClock):
        raise PreconditionError(
            f"{engine.device.id}'s process reads the emulator's clock itself: no host clock of its"
            " own to skew (its launcher gives none)",
            field="kind",
            subject=engine.device.id,
            reason="NO_LOCAL_CLOCK",
        )
    return clock


def sharing(engine: DeviceEngine, clock: LocalClock) -> list[DeviceEngine]:
    """The devices that read `clock`: the skewed process's."""
    return [e for e in engine.faults.siblings.values() if e.clock is clock] or [engine]


@dataclass(frozen=True)
class ClockSkew:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        clock = local_clock(engine)
        for other in sharing(engine, clock):
            if other is not engine and NAME in other.faults.active:
                raise PreconditionError(
                    f"this process's clock is skewed already, through {other.device.id}",
                    field="kind",
                    subject=other.device.id,
                    reason="FAULT_ALREADY_ACTIVE",
                )
        params: ClockSkewParams = fault.params
        clock.set_skew(
            Skew(
                offset_ns=round(params.offset_s * 1e9),
                drift_ppm=params.drift_ppm,
                since_ns=clock.true_ns(),
            )
        )
        fault.since_ns = clock.now_ns()  # in the process's (now skewed) time, as it stamps
        if fault.for_s:
            fault.until_ns = fault.since_ns + round(fault.for_s * 1e9)
        for other in sharing(engine, clock):
            other.health_moved()  # the process's liveness beats with the skewed stamp at once

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        clock = local_clock(engine)
        clock.set_skew(None)
        for other in sharing(engine, clock):
            other.health_moved()


KIND = Kind(
    name=NAME,
    help="the clock of a device's process reads offset_s off and drifts drift_ppm, until cleared",
    params=ClockSkewParams,
    effect=ClockSkew(),
    target="a device id (its process's clock: the node's in procs mode, the device's in process)",
)
