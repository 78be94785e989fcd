"""What a chaos run is asked (`RunOptions`) and what it gives back (`RunResult`): the runner's
interface, apart from its machinery (runner.py), for the CLI, the pytest plugin and the
benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.chaos.asserting import FaultRecoveries, pick
from cmemu.emulator.model.chaos.observed import Observations
from cmemu.emulator.model.chaos.pace import ABORTED, FAIL, PASS, Pace
from cmemu.emulator.model.chaos.recovery import Recovery
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.timeline import Entry
from cmemu.emulator.model.chaos.verdict import Verdict


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    seed: int | None = None  # overrides the scenario's
    keep: bool = False  # leave the workloads running at the end
    early_end: bool = True  # end once every fault has recovered (and settled)
    # wall seconds the whole run may take (None: stall_limit_s of the scenario); past it the
    # run stops with DeadlineExceededError naming what it was waiting for, never hangs a CI job
    wall_limit_s: float | None = None
    # the pace of the steps and traffic (overrides the scenario's `time_scale`; None: its own)
    time_scale: float | None = None
    # deployments start warm (their weights already in EMS, as `serve-model --warm`): the set-up
    # loads from EMS (80 emulated s for small.yaml) instead of cold (640 s); nothing judged is
    # in the set-up, so a run that does not test the first load need not wait for it
    warm: bool = False


DEFAULTS = RunOptions()

STALL_SLACK_WALL_S = 600.0  # starts, loads and time holds (a restarted container's, 180 s each)
STALL_FACTOR = 10.0  # the scenario's own wall time at its time scale, this many times over


def stall_limit_s(scenario_emulated_s: float, time_scale: float) -> float:
    """How long a run may take in wall seconds before it is judged stalled: generous (a busy
    host runs emulated time slower, down to the clock's min_rate for a while), since its only
    job is that a run whose clock or calls stopped answering ends, and says where it stood."""
    return STALL_SLACK_WALL_S + STALL_FACTOR * scenario_emulated_s / max(time_scale, 1e-9)


@dataclass(kw_only=True)
class RunResult:
    scenario: Scenario
    seed: int
    observations: Observations
    recoveries: list[Recovery]
    verdict: Verdict
    timeline: list[Entry]
    wall_s: float  # all of it: workloads started, the scenario, clean-up
    setup_wall_s: float  # starting the workloads (a deployment's weights load in emulated time)
    scenario_wall_s: float  # from the workloads being up to the end of observing
    time_scale: float
    pace: Pace | None = None  # how the run kept pace (None: the fabric did not say)
    notes: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """PASS, FAIL, or ABORTED when the run did not keep pace (emulator/model/chaos/pace.py)."""
        if self.pace is not None and self.pace.aborted:
            return ABORTED
        return PASS if self.verdict.ok else FAIL

    @property
    def ok(self) -> bool:
        return self.outcome == PASS

    def fault(self, name: str) -> FaultRecoveries:
        """A step's faults (or a kind's) for a per-fault bound in one line:
        `result.fault("crash").recovered_within("5m")` (emulator/model/chaos/asserting.py)."""
        return pick(self.recoveries, name)
