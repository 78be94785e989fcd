"""An instance started through the API, no CLI process in between, that the real `cmemu`
attaches to by its state file (issue 18 item 5): it lists the devices, injects a fault with the
token file the instance wrote; a second instance on the same file is refused; after the stop
nothing is left to attach to, and the CLI says so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.runtime import instance, state
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions
from cmemu.emulator.testing import free_port_block, launch_ports, run_cmemu


def _options() -> LaunchOptions:
    return LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(launch_ports("cm-mini")))),
        broker=NO_BROKER,
        drain_s=0.0,
        token="instance-test-token",
    )


async def test_an_instance_started_by_the_api_is_attached_to_by_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "lab.json"
    async with instance.start(_options(), path, argv=("api",)) as hosted:
        assert hosted.name == "lab" and path.exists()
        assert state.token_path(path).read_text().strip() == "instance-test-token"
        ls = await asyncio.to_thread(run_cmemu, "ls", "--state-file", str(path))
        assert ls.returncode == 0, ls.stderr
        assert "n00-npu0" in ls.stdout and "SERVING" in ls.stdout
        added = await asyncio.to_thread(
            run_cmemu, "fault", "add", "hang", "n01-npu2", "--state-file", str(path)
        )
        assert added.returncode == 0, added.stderr
        faults = await asyncio.to_thread(run_cmemu, "fault", "ls", "--state-file", str(path))
        assert "n01-npu2" in faults.stdout and "hang" in faults.stdout
        assert state.read_instance(path).launcher.argv == ("api",)

        # the file is held: a second instance is refused before anything starts
        with pytest.raises(state.AlreadyRunningError) as held:
            async with instance.start(_options(), path):
                pytest.fail("a second instance started on a held state file")
        assert "lab" in str(held.value)

    assert not path.exists() and not state.token_path(path).exists()
    gone = await asyncio.to_thread(run_cmemu, "ls", "--state-file", str(path))
    assert gone.returncode != 0 and str(path) in gone.stderr


async def test_a_stale_state_file_is_taken_over(tmp_path: Path) -> None:
    """A file whose launcher is gone (a killed `cmemu up`) does not hold the name."""
    path = tmp_path / "lab.json"
    async with instance.start(_options(), path):
        doc = path.read_text()
    stale = doc.replace(f'"pid": {os.getpid()}', '"pid": 999999999')
    assert stale != doc
    path.write_text(stale)
    assert instance.stale_removed(path) == 999_999_999 and not path.exists()
    async with instance.start(_options(), path) as hosted:
        assert state.read_instance(hosted.path).alive
