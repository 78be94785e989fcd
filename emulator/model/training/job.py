"""A training job's progress and recovery as a state machine, the same in live and model mode.

starting -> running -> (recovering -> running)* -> finished | failed | stopped. A failure rewinds
the step to the last checkpoint (the steps since are lost and counted); goodput is the useful
step time (steps kept) over the emulated time since the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.training.checkpoint import due, steps_lost

NS = 1_000_000_000
STARTING, RUNNING, RECOVERING = "starting", "running", "recovering"
FINISHED, FAILED, STOPPED = "finished", "failed", "stopped"
ENDED = frozenset({FINISHED, FAILED, STOPPED})


@dataclass(kw_only=True)
class JobProgress:
    name: str
    steps: int  # 0: until stopped
    checkpoint_every: int
    started_ns: int
    state: str = STARTING
    step: int = 0
    last_checkpoint_step: int = 0
    restarts: int = 0
    steps_lost: int = 0
    failed_steps: int = 0  # steps a dead or hung rank failed (the data path, issue 20)
    step_s: float = 0.0
    useful_s: float = 0.0
    last_failure_ns: int = 0
    last_restored_ns: int = 0
    last_corrupt_checkpoint_ns: int = 0  # a restore found the latest corrupt, fell back
    ended_ns: int = 0
    error: str = ""
    npus: list[str] = field(default_factory=list)

    def running(self, step_s: float) -> None:
        self._not_ended()
        self.state = RUNNING
        self.step_s = step_s

    def step_done(self) -> bool:
        """One more step kept; True when a checkpoint is now due."""
        self.step += 1
        self.useful_s += self.step_s
        return due(self.step, self.checkpoint_every)

    @property
    def done(self) -> bool:
        return self.steps > 0 and self.step >= self.steps

    def checkpointed(self, step: int) -> None:
        self.last_checkpoint_step = max(self.last_checkpoint_step, step)

    def failed(self, now_ns: int) -> int:
        """Stop at a failure: back to the last checkpoint; the steps lost."""
        self._not_ended()
        lost = steps_lost(self.step, self.last_checkpoint_step)
        self.steps_lost += lost
        self.useful_s = max(0.0, self.useful_s - lost * self.step_s)
        self.step = self.last_checkpoint_step
        self.state = RECOVERING
        self.last_failure_ns = now_ns
        return lost

    def fell_back(self, step: int, now_ns: int) -> int:
        """The latest checkpoint did not verify: rewind further, to `step` (an older checkpoint,
        or 0 with none left); the further steps lost. `now_ns` dates the detection (a chaos
        verdict credits a checkpoint-corrupt fault with it)."""
        self.last_corrupt_checkpoint_ns = now_ns
        lost = max(0, self.step - step)
        self.steps_lost += lost
        self.useful_s = max(0.0, self.useful_s - lost * self.step_s)
        self.step = self.last_checkpoint_step = step
        return lost

    def restored(self, now_ns: int, step_s: float) -> None:
        self.restarts += 1
        self.last_restored_ns = now_ns
        self.running(step_s)

    def end(self, state: str, now_ns: int, error: str = "") -> None:
        if self.state in ENDED:
            return
        self.state = state
        self.ended_ns = now_ns
        self.error = error

    def goodput(self, now_ns: int) -> float:
        end = self.ended_ns or now_ns
        elapsed = (end - self.started_ns) / NS
        return min(1.0, self.useful_s / elapsed) if elapsed > 0 else 0.0

    def _not_ended(self) -> None:
        if self.state in ENDED:
            raise PreconditionError(
                f"training job {self.name!r} is {self.state}", subject=self.name, reason="JOB_ENDED"
            )
