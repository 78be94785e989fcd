"""A busy host is not a fault; a stopped process is.

Both end to end, with the reference cluster manager watching: beside a two-core CPU hog
(stress-ng) no device of a healthy supernode is ever failed, and emulated time slows instead;
a node's process stopped with SIGSTOP is found and its devices failed, the process named silent
by the owner of emulated time, and back once it continues."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import fabric_pb2, manager_pb2

pytestmark = pytest.mark.slow
SCALE = 20.0
STRESS_NG = shutil.which("stress-ng")


@contextmanager
def cpu_hog(seconds: int) -> Iterator[None]:
    """Both cores busy (stress-ng, Debian's), ended on exit whatever happens."""
    if STRESS_NG is None:
        pytest.fail("stress-ng is not installed (.ci/run installs it)")
    hog = subprocess.Popen(
        [STRESS_NG, "--cpu", "2", "--timeout", f"{seconds}s", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        hog.terminate()
        hog.wait(timeout=30)


async def incidents(sn: Supernode) -> list[manager_pb2.Incident]:
    reply = await sn.clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
    return list(reply.incidents)


async def test_a_busy_host_fails_no_device_and_slows_time_instead() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        assert sn.time is not None
        clock = sn.time.clock
        start = clock.now_s()
        with cpu_hog(12):
            # the host is busy for 12 wall seconds: 240 emulated seconds at the asked scale,
            # 16 heartbeat rounds; wait on emulated time, so a slower rate only takes longer
            await sn.time.timeline.sleep(60.0)
        assert await incidents(sn) == []
        status = await sn.clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest())
        assert status.devices_failed == 0 and status.devices_suspect == 0
        info = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
        assert info.emulated_ns / 1e9 >= start + 60.0
        assert info.rate <= SCALE and info.achieved_scale <= SCALE * (1 + 1e-6)  # float rounding
        assert list(info.silent) == []


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
async def test_a_stopped_process_is_found_and_its_devices_failed(tmp_path: object) -> None:
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=34)),
        time_scale=SCALE,
        broker="none",
        drain_s=0.0,
    )
    async with Supernode.start(options) as sn:
        assert sn.supervisor is not None and sn.time is not None
        node = sn.supervisor.running["n01"]
        victims = {d.id for d in sn.topology.in_node("n01")}
        manager = sn.clients.manager()
        for _ in range(600):  # every process's liveness stream open before the stop
            status = await manager.GetStatus(manager_pb2.GetManagerStatusRequest())
            if status.devices_covered == len(sn.topology.devices):
                break
            await asyncio.sleep(0.1)
        assert status.liveness_streams == len(sn.topology.nodes)  # one per node's process
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(600):  # the manager judges on emulated time; the runs of this poll
                found = {i.device for i in await incidents(sn)}  # are bounded, not timed
                if victims <= found:
                    break
                await asyncio.sleep(0.1)
            assert victims <= found, f"not failed: {sorted(victims - found)}"
            assert not (found - victims), f"failed though not stopped: {found - victims}"
            listed = await incidents(sn)
            assert {i.detected_by for i in listed} == {"heartbeat"}, [
                (i.device, i.detail) for i in listed
            ]
            for _ in range(600):  # the owner of time stops waiting for it after the profile's
                info = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
                if "n01" in info.silent:  # `stale_s` wall seconds: maybe after the manager
                    break  # found its devices (that is on emulated time)
                await asyncio.sleep(0.1)
            assert "n01" in info.silent
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        for _ in range(600):  # it continues: its devices answer again
            status = await sn.clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest())
            if status.devices_failed == 0:
                break
            await asyncio.sleep(0.1)
        assert status.devices_failed == 0
