"""The scheduler's model: NPUs by node and rack, jobs, allocation policies, spares, failures.

Pure data and computation (no gRPC, no I/O): emulator/engines/scheduler/ runs it and
bench/alloc.py replays job streams through it.
"""

from cmemu.emulator.model.scheduler.inventory import Inventory, NodeSlots
from cmemu.emulator.model.scheduler.jobs import Allocation, JobRequest, Replacement, check_job
from cmemu.emulator.model.scheduler.policies import (
    DEFAULT_POLICY,
    POLICIES,
    FreeNode,
    Policy,
    get_policy,
    place,
)
from cmemu.emulator.model.scheduler.queue import PendingQueue
from cmemu.emulator.model.scheduler.state import Scheduler

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Allocation",
    "FreeNode",
    "Inventory",
    "JobRequest",
    "NodeSlots",
    "PendingQueue",
    "Policy",
    "Replacement",
    "Scheduler",
    "check_job",
    "get_policy",
    "place",
]
