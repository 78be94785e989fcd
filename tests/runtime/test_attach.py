"""Attaching to a running instance by its name (issue 18 item 5): one started through the API
in this process and one `cmemu up` in another, both found by name, called through typed clients
with their token, and stopped through the attached handle; an unknown name, a bad one and a
stale state file each say what is wrong."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.runtime import instance, state
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions
from cmemu.emulator.testing import MINI_PORTS, cmemu_up, free_port_block
from cmemu.v1 import device_pb2

TOKEN = "attach-test-token"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Names resolve in this test's own state directory (and in the CLI it starts)."""
    monkeypatch.setenv(state.DIR_ENV_VAR, str(tmp_path))
    monkeypatch.delenv(state.ENV_VAR, raising=False)
    return tmp_path


def _options() -> LaunchOptions:
    return LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(MINI_PORTS))),
        broker=NO_BROKER,
        drain_s=0.0,
        token=TOKEN,
    )


async def test_an_instance_started_here_is_attached_by_name_and_stopped(state_dir: Path) -> None:
    async with instance.start(_options(), name="lab") as hosted:
        assert hosted.path == state_dir / "lab.json"
        async with instance.attach("lab") as lab:
            assert (lab.name, lab.pid, lab.mode) == ("lab", os.getpid(), "inprocess")
            assert lab.token == TOKEN and lab.tls_ca is None and lab.alive
            assert [d.id for d in lab.topology.devices] == [
                d.id for d in hosted.supernode.topology.devices
            ]
            info = await lab.clients.device("n01-npu2").GetInfo(device_pb2.GetInfoRequest())
            assert info.id == "n01-npu2"
            # the token is the instance's: a state-changing call goes through with it
            hang = await faults.inject(lab.clients, "hang", "n01-npu2")
            assert hang.target == "n01-npu2"
            listed = await faults.list_all(lab.clients)
            assert {f.target for f in listed} == {"n01-npu2"}  # the device's, the fabric's
        stopper = instance.attach("lab")
        asked = asyncio.create_task(stopper.stop(timeout_s=60.0))
        await hosted.wait_stop()  # the host serves until the attached handle asks it to stop
    await asked  # the state file went with the stop
    assert not (state_dir / "lab.json").exists() and not state.token_path(hosted.path).exists()
    with pytest.raises(NotFoundError, match="no instance 'lab' running"):
        instance.attach("lab")


def test_a_cmemu_up_in_another_process_is_attached_by_name_and_stopped(state_dir: Path) -> None:
    path = state_dir / "far.json"
    token_file = state_dir / "far-token"
    token_file.write_text(TOKEN + "\n")
    base = str(free_port_block(MINI_PORTS))
    args = ("--preset", "cm-mini", "--base-port", base, "--broker", "none", "--ui", "none")
    with cmemu_up(path, *args, "--token-file", str(token_file), quiet=True) as proc:

        async def attached() -> None:
            far = instance.attach("far")
            try:
                assert far.pid == proc.pid and far.token == TOKEN and far.mode == "inprocess"
                info = await far.clients.device("n00-npu0").GetInfo(device_pb2.GetInfoRequest())
                assert info.id == "n00-npu0"
            finally:
                await far.close()
            await instance.attach("far").stop(timeout_s=60.0)

        asyncio.run(attached())
        assert proc.wait(timeout=60) == 0  # SIGTERM: the launcher's own orderly stop
        assert not path.exists()


def test_an_unknown_name_says_which_and_where(state_dir: Path) -> None:
    with pytest.raises(NotFoundError) as missing:
        instance.attach("nobody")
    said = str(missing.value)
    assert "'nobody'" in said and str(state_dir) in said
    with pytest.raises(InvalidArgumentError, match="bad instance name"):
        instance.attach("Not_A_Label")


async def test_a_stale_state_file_is_not_attached(state_dir: Path) -> None:
    """A launcher killed without its stop left its state file: attaching says it is gone."""
    async with instance.start(_options(), name="gone"):
        doc = (state_dir / "gone.json").read_text()
    (state_dir / "gone.json").write_text(doc.replace(f'"pid": {os.getpid()}', '"pid": 999999999'))
    with pytest.raises(instance.StaleInstanceError) as stale:
        instance.attach("gone")
    assert stale.value.pid == 999_999_999 and "is stale" in str(stale.value)
    assert "cmemu down --name gone" in str(stale.value)
    assert isinstance(stale.value, NotFoundError)  # not running: what a caller checks first
