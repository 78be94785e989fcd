"""An NPU's dies: each runs kernels in order on its cube cores, in emulated time.

A kernel's duration is its roofline time from the cost model (slowed by a `slow` fault's compute
share); kernels queue per die, which is what the utilisation in telemetry measures. Devices of
other kinds have no dies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.costmodel import kernel_cost
from cmemu.emulator.model.errors import CapacityError, InvalidArgumentError, OutOfRangeError, blame

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine


@dataclass
class Die:
    """An NPU die's compute queue: when it is next free, and how long it has been busy."""

    busy_until_ns: int = 0
    busy_ns: int = 0


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """A kernel to run on a die: its work in FLOPs and bytes, at a precision."""

    name: str
    die: int
    flops: float
    bytes_moved: int
    precision: str  # "BF16", "FP16", "INT8", ... (the profile's peak_ops_per_s_per_die keys)


@dataclass(frozen=True, kw_only=True)
class KernelResult:
    """When a kernel ran on its die, and whether compute or memory bounded it."""

    name: str
    die: int
    issue_ns: int
    start_ns: int
    complete_ns: int
    duration_ns: int
    bound: str  # "compute" or "memory"


class Dies:
    def __init__(self, engine: DeviceEngine, count: int) -> None:
        self.engine = engine
        self.dies = [Die() for _ in range(count)]

    @property
    def count(self) -> int:
        return len(self.dies)

    def run(self, kernel: Kernel) -> KernelResult:
        """Queue a kernel on its die; when it will run and end."""
        e = self.engine
        e.require_healthy()
        if not math.isfinite(kernel.flops) or kernel.flops < 0:
            raise InvalidArgumentError(
                f"flops must be finite and >= 0, got {kernel.flops}", field="flops"
            )
        if kernel.die >= len(self.dies):
            raise OutOfRangeError(
                f"die {kernel.die} does not exist; {e.device.id} has {len(self.dies)}",
                field="die",
                subject=e.device.id,
                reason="DIE_NOT_FOUND",
            )
        e.require_die(kernel.die)
        with (
            blame(
                field="precision",
                subject=kernel.precision,
                reason="UNSUPPORTED_PRECISION",
                on=InvalidArgumentError,
            ),
            blame(subject=e.device.id),
        ):
            cost = kernel_cost(kernel.flops, kernel.bytes_moved, kernel.precision, e.profile)
        if e.effects.compute_share < 1:  # a slow fault: the same work takes longer
            cost = dataclasses.replace(
                cost, duration_ns=round(cost.duration_ns / e.effects.compute_share)
            )
        die = self.dies[kernel.die]
        issue = e.clock.now_ns()
        start = max(issue, die.busy_until_ns)
        backlog_max_ns = round(e.profile.limits.engine_backlog_max_s * 1e9)
        if start - issue + cost.duration_ns > backlog_max_ns:
            raise CapacityError(
                f"work queued on die {kernel.die} of {e.device.id}",
                cost.duration_ns,
                max(0, backlog_max_ns - (start - issue)),
                unit="emulated ns",
                field="die",
                subject=e.device.id,
                reason="ENGINE_QUEUE_FULL",
            )
        die.busy_until_ns = start + cost.duration_ns
        die.busy_ns += cost.duration_ns
        e.latency.kernel.observe((die.busy_until_ns - issue) / 1e9)
        return KernelResult(
            name=kernel.name,
            die=kernel.die,
            issue_ns=issue,
            start_ns=start,
            complete_ns=die.busy_until_ns,
            duration_ns=cost.duration_ns,
            bound=cost.bound,
        )

    def utilization(self) -> float:
        elapsed = self.engine.clock.now_ns()
        if not self.dies or elapsed <= 0:
            return 0.0
        busy = sum(min(d.busy_ns, elapsed) for d in self.dies)
        return busy / (elapsed * len(self.dies))

    def drop_queued(self) -> None:
        """A restart: kernels queued and not yet run are gone."""
        now = self.engine.clock.now_ns()
        for die in self.dies:
            die.busy_until_ns = min(die.busy_until_ns, now)
