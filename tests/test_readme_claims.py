"""README's figures and examples against the code (issue 21, findings 14 and 18): a claim a new
user follows must hold, and a change to the code that breaks one fails here, not in their shell."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scheduler.inventory import Inventory
from cmemu.emulator.model.scheduler.jobs import JobRequest
from cmemu.emulator.model.scheduler.state import Scheduler
from cmemu.emulator.model.topology import build
from cmemu.emulator.runtime.composegen import MOSQUITTO_PASSWD, TOKEN_FILE, write_secrets

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_compose_service_count_is_the_committed_file_s() -> None:
    said = re.search(r"memory pool,\s+service and the broker: (\d+) for cm384\)", README)
    assert said is not None, "README no longer states cm384's compose service count"
    services = yaml.safe_load((ROOT / "compose" / "cm384.yaml").read_text())["services"]
    assert int(said.group(1)) == len(services)


def test_the_secret_files_modes_are_the_ones_written(tmp_path: Path) -> None:
    write_secrets(tmp_path)
    assert (tmp_path / TOKEN_FILE).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / MOSQUITTO_PASSWD).stat().st_mode & 0o777 == 0o644
    assert "a compose secret, mode 0600" in README
    assert "`mosquitto.passwd` (its salted hash, mode\n  0644" in README


def test_the_scheduling_example_replaces_an_npu_of_its_own_job() -> None:
    """The README's `sched alloc` lines on cm384 (`cmemu up -d`'s default preset), then its
    `sched replace`: the NPU it names belongs to the job (not NOT_IN_JOB)."""
    lines = [
        ln.split("#")[0]
        for ln in README.splitlines()
        if ln.startswith("cmemu sched ") and not ln.startswith("cmemu sched day ")  # a day plan
    ]
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
