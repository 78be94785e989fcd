"""Deaths are events, and events arrive: a process that exits on its own is a `died` event for
every server it hosted, published by the launcher that supervised it, on the same topics, QoS
and shape as every other event."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.runtime.launchmodes import Compose, Procs
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from tests.runtime.test_mqtt import listening

pytestmark = pytest.mark.slow

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"


async def test_a_killed_node_process_is_a_died_event_for_each_of_its_devices(
    tmp_path: Path,
) -> None:
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=33), run_dir=tmp_path / "run"),
    )
    async with Supernode.start(options) as sn:
        assert sn.broker is not None  # the embedded broker, by default
        async with listening(sn.broker, sn.security.mqtt_login()) as listener:
            assert sn.supervisor is not None
            node = sn.supervisor.running["n01"]
            node.proc.send_signal(signal.SIGKILL)
            devices = {d.id for d in sn.topology.in_node("n01")}
            await listener.wait_for(lambda: len(listener.events("died")) == len(devices))
            died = listener.events("died")
            assert {p["device"] for p in died} == devices
            topics = {t for t, p in listener.messages if p.get("event") == "died"}
            assert topics == {f"cmemu/{sn.topology.supernode}/{d}/events" for d in devices}
            for p in died:
                assert p["exit_code"] == -signal.SIGKILL
                assert p["pid"] == node.proc.pid and p["process"] == "n01"
                assert p["log"] == str(node.log_path)
                assert p["emulated_ns"] > 0 and p["wall"] > sn.topology.epoch_wall_s
            await asyncio.sleep(0.3)
            assert len(listener.events("died")) == len(devices)  # once each
            assert not any(p["device"].startswith("n00") for p in listener.events("died"))
    assert (tmp_path / "run" / "logs" / "n01.log").exists()  # kept: a process died


@pytest.mark.xdist_group("loopback-compose")  # 127.60.x.y, compose's: see tests/conftest.py
async def test_a_killed_compose_service_is_a_died_event(tmp_path: Path) -> None:
    options = LaunchOptions(
        mode=Compose(file=COMPOSE_DIR / "cm-mini.yaml", run_dir=tmp_path / "run")
    )
    async with Supernode.start(options) as sn:
        assert sn.broker is not None and sn.supervisor is not None
        async with listening(sn.broker, sn.security.mqtt_login()) as listener:
            victim = sn.supervisor.running["n00-npu3"]
            victim.proc.send_signal(signal.SIGKILL)
            await listener.wait_for(lambda: bool(listener.events("died")))
            (died,) = listener.events("died")
            assert died["device"] == "n00-npu3" and died["process"] == "n00-npu3"
            assert died["exit_code"] == -signal.SIGKILL and died["pid"] == victim.proc.pid
