"""README's figures and examples against the code (issue 21, finding 14): a claim a new
user follows must hold, and a change to the code that breaks one fails here, not in their shell."""

from __future__ import annotations

import shlex
from pathlib import Path

from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.scheduler.inventory import Inventory
from emulator.model.scheduler.jobs import JobRequest
from emulator.model.scheduler.state import Scheduler
from emulator.model.topology import build

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_scheduling_example_replaces_an_npu_of_its_own_job() -> None:
    """The README's `sched alloc` lines on cm384 (`cmemu up -d`'s default preset), then its
    `sched replace`: the NPU it names belongs to the job (not NOT_IN_JOB)."""
    lines = [ln.split("#")[0] for ln in README.splitlines() if ln.startswith("cmemu sched ")]
    inventory = Inventory.from_topology(build("cm384"), DEFAULT_PROFILE)
    spares = min(DEFAULT_PROFILE.scheduler.spares_per_rack * len(inventory.racks), inventory.size)
    model = Scheduler(inventory, spares=spares)
    replaced = 0
    for line in lines:
        words = shlex.split(line)[2:]
        if words[0] == "alloc":
            model.allocate(
                JobRequest(
                    job=words[1],
                    npus=int(words[words.index("--npus") + 1]),
                    whole_nodes="--whole-nodes" in words,
                    same_rack="--same-rack" in words,
                    policy=words[words.index("--policy") + 1] if "--policy" in words else "",
                ),
                0,
            )
        elif words[0] == "replace":
            _, swaps = model.replace(words[1], npu=words[words.index("--npu") + 1])
            assert len(swaps) == 1
            replaced += 1
    assert replaced == 1
