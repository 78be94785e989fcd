"""The typed launch API: every mode started and stopped through one call, no CLI involved."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from pathlib import Path

import pytest

from cmemu.emulator.client import health
from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    PreconditionError,
    UnavailableError,
    UnknownNameError,
)
from cmemu.emulator.runtime.forked import ForkedProcess
from cmemu.emulator.runtime.launchmodes import Compose, InProcess, Procs
from cmemu.emulator.runtime.launchoptions import CMEMU
from cmemu.emulator.runtime.procs import Running
from cmemu.emulator.runtime.procslaunch import proc_waves
from cmemu.emulator.runtime.supernode import (
    NO_BROKER,
    LaunchOptions,
    StartInterrupted,
    Supernode,
)
from cmemu.emulator.testing import MINI_PORTS, free_port_block
from cmemu.v1 import device_pb2, fabric_pb2

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"


def test_options_refuse_what_cannot_run() -> None:
    with pytest.raises(InvalidArgumentError, match="mode must be one of InProcess"):
        LaunchOptions(mode="vm")  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match="unknown preset"):
        LaunchOptions(preset="cm999")
    with pytest.raises(InvalidArgumentError, match="time_scale"):
        LaunchOptions(time_scale=0)
    with pytest.raises(InvalidArgumentError, match="file must be a Path"):
        LaunchOptions(mode=Compose(file=None))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="mqtt://"):
        LaunchOptions(broker="http://example")


def test_procs_start_in_waves_fabric_devices_then_ems(tmp_path: Path) -> None:
    topology = LaunchOptions(preset="cm-mini", mode=Procs()).topology()
    waves = proc_waves(topology, tmp_path / "topology.json", "node")
    names = [sorted(s.name for s in w) for w in waves]
    assert names == [["fabric"], ["n00", "n01"], ["ems", "scheduler"], ["router"], ["manager"]]
    assert all(a.endswith(":50051") for w in waves for s in w for a in s.addresses)
    ems = next(s for s in waves[2] if s.name == "ems").argv
    assert ems[ems.index("--ssd-dir") + 1] == str(tmp_path / "ems-ssd")
    per_device = proc_waves(topology, tmp_path / "topology.json", "device")
    assert len(per_device[1]) == len(topology.devices)


async def test_in_process_supernode_serves_and_stops() -> None:
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(MINI_PORTS))),
        broker=NO_BROKER,
        drain_s=0.0,
    )
    async with Supernode.start(options) as sn:
        info = await sn.clients.device("n01-cpu2").GetInfo(device_pb2.GetInfoRequest())
        assert (info.id, info.node) == ("n01-cpu2", "n01")
        assert sn.address("fabric") == sn.topology.services[0].address
        assert sn.local.fabric is not None
        assert sn.topology.epoch_wall_s is not None
        address = sn.address("n00-npu0")
        # started without cyclic collections, its servers' objects frozen (runtime/heap.py)
        assert gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0  # unfrozen by the stop: collectable again
    statuses = await health.check_many([address], timeout_s=1.0)
    assert statuses[address] == health.UNREACHABLE


@pytest.mark.slow
async def test_process_mode_reports_a_killed_process_and_keeps_its_log(tmp_path: Path) -> None:
    deaths: list[Running] = []
    died = asyncio.Event()

    def on_death(running: Running) -> None:
        deaths.append(running)
        died.set()

    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=31), run_dir=tmp_path / "run"),
        broker=NO_BROKER,
    )
    async with Supernode.start(options, on_death=on_death) as sn:
        with pytest.raises(PreconditionError, match="other processes"):
            _ = sn.local
        info = await sn.clients.device("n01-mem").GetInfo(device_pb2.GetInfoRequest())
        assert info.node == "n01"
        node = sn.supervisor.running["n01"] if sn.supervisor else None
        assert node is not None
        node.proc.send_signal(signal.SIGKILL)
        async with asyncio.timeout(10):
            await died.wait()
        assert [d.spec.name for d in sn.died] == ["n01"]
        assert await health.check_address(sn.address("n00-npu0")) == "SERVING"
        pids = [r.proc.pid for r in sn.supervisor.running.values()] if sn.supervisor else []
    for pid in pids:  # every process is gone, and the run directory kept for the dead one's log
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "run" / "logs" / "n01.log").exists()


@pytest.mark.slow
async def test_a_stop_during_start_stops_everything(tmp_path: Path) -> None:
    stop = asyncio.Event()
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(plan=LoopbackPlan(first_octet=32), run_dir=tmp_path / "run"),
        broker=NO_BROKER,
    )
    asyncio.get_running_loop().call_later(0.3, stop.set)
    with pytest.raises(StartInterrupted):
        async with Supernode.start(options, stop=stop):
            pytest.fail("it should not have finished starting")
    address = options.topology().devices[0].address
    with pytest.raises(UnavailableError):
        await health.check_address(address, timeout_s=0.5)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-compose")  # 127.60.x.y, compose's: see tests/conftest.py
async def test_compose_mode_runs_the_committed_file(tmp_path: Path) -> None:
    options = LaunchOptions(
        mode=Compose(file=COMPOSE_DIR / "cm-mini.yaml", run_dir=tmp_path / "run")
    )
    async with Supernode.start(options) as sn:
        assert sn.broker is not None and sn.broker.startswith("mqtt://127.60.")
        info = await sn.clients.device("n00-npu3").GetInfo(device_pb2.GetInfoRequest())
        assert info.eid == sn.topology.device("n00-npu3").eid
        # no $CMEMU_EPOCH: the fabric took the epoch, every process asked it, and so did we
        clock = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
        assert sn.topology.epoch_wall_s == clock.epoch_wall_s
        # the file's `cmemu` commands were forked from one fork server, as process mode's are;
        # its mosquitto, another program, was exec'd
        assert sn.supervisor is not None and sn.supervisor.fork_server is not None
        running = list(sn.supervisor.running.values())
        forked = {r.spec.name for r in running if isinstance(r.proc, ForkedProcess)}
        assert forked == {r.spec.name for r in running if r.spec.argv[0] == CMEMU}
        assert len(forked) == len(running) - 1 and "mosquitto" not in forked, forked
