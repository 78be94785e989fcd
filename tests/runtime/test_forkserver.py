"""Process mode's fork server (emulator/runtime/forkserver.py, forked.py): processes forked from
one process that imported the serve path once are real `cmemu serve` processes, owned by the
supervisor exactly as exec'd ones are: they serve, pause, die with their code, log, and stop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.client import health
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, UnavailableError
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime.forked import ForkOptions, fork_wanted
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.launchoptions import CMEMU
from cmemu.emulator.runtime.procs import FORK_SERVER_LOG, ProcSpec, Running, Supervisor
from cmemu.emulator.runtime.serve import EPOCH_ENV, ServeKind, serve_argv
from cmemu.emulator.runtime.supernode import LaunchOptions
from cmemu.emulator.testing import free_port_block, launch_ports
from tests.runtime.test_imports import HEAVY, NO_BROKER, UNCALLED

pytestmark = pytest.mark.slow

FORK = ForkOptions(program=CMEMU)
WAIT_S = 120.0  # a loaded host (these run beside a CPU hog once)
Fabric = tuple[Supervisor, Topology, Path, list[Running]]


def mini(epoch: float | None = 1.0) -> Topology:
    """cm-mini on a free block of this host's ports, without /metrics (several processes on one
    host would all bind its one port)."""
    base = free_port_block(launch_ports("cm-mini"))
    options = LaunchOptions(preset="cm-mini", mode=Procs(plan=PortPlan(base_port=base)))
    return dataclasses.replace(options.topology(), metrics_port=None, epoch_wall_s=epoch)


def spec(
    path: Path, kind: ServeKind, name: str, address: str, env: dict[str, str] | None = None
) -> ProcSpec:
    """What procslaunch.proc_waves makes."""
    ssd = str(path.parent / "ssd")
    argv = serve_argv(CMEMU, str(path), kind, name, ems_ssd_dir=ssd, log_level="warning")
    return ProcSpec(
        name=name, argv=tuple(argv), env=env or {}, addresses=(address,), servers=(name,)
    )


def stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, session...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def alive(pid: int) -> bool:
    """A process with this pid exists and is no zombie."""
    try:
        return stat(pid)[0] != "Z"
    except OSError:
        return False


async def until(condition: Callable[[], object]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():  # noqa: ASYNC110 (a process's state, a file: no event for it)
            await asyncio.sleep(0.1)


@pytest.fixture
async def fabric(tmp_path: Path) -> AsyncIterator[Fabric]:
    """A forking supervisor, its fabric already SERVING (the devices follow its clock)."""
    topology = mini()
    path = tmp_path / "topology.json"
    path.write_text(topology.to_json())
    exits: list[Running] = []
    async with Supervisor(log_dir=tmp_path / "logs", on_exit=exits.append, fork=FORK) as sup:
        address = topology.service(ServiceKind.FABRIC).address
        await sup.start([spec(path, "service", "fabric", address)])
        await health.wait_serving([address], timeout_s=WAIT_S)
        yield sup, topology, path, exits


async def test_forked_processes_serve_pause_die_log_and_stop(fabric: Fabric) -> None:
    sup, topology, path, exits = fabric
    assert sup.launch_path == "fork server" and sup.fork_server is not None
    devices = [topology.device(d) for d in ("n00-npu0", "n00-npu1", "n01-cpu0")]
    await sup.start([spec(path, "device", d.id, d.address) for d in devices])
    await health.wait_serving([d.address for d in devices], timeout_s=WAIT_S)
    server_pid = sup.fork_server.proc.pid
    procs = {name: r.proc for name, r in sup.running.items()}
    for name, proc in procs.items():
        fields = stat(proc.pid)
        assert int(fields[1]) == os.getpid()  # the supervisor's own child, not the server's
        assert int(fields[3]) == proc.pid  # a session of its own, as start_new_session makes
        argv = cmdline(proc.pid)
        assert CMEMU in argv[:2] and "serve" in argv and name in argv  # `ps` shows what runs

    paused = sup.running["n00-npu1"]
    async with grpc.aio.insecure_channel(devices[1].address) as channel:
        paused.proc.send_signal(signal.SIGSTOP)
        assert not await health.serving(channel, timeout_s=1.0)  # stopped: nothing answers
        paused.proc.send_signal(signal.SIGCONT)
        assert await health.serving(channel, timeout_s=WAIT_S)
    assert not exits  # a pause is no death

    victim = sup.running["n01-cpu0"]
    victim.proc.kill()
    await until(lambda: exits)
    assert exits == [victim] and sup.died == [victim]
    assert victim.returncode == -signal.SIGKILL == victim.proc.returncode
    with pytest.raises(ProcessLookupError):
        victim.proc.send_signal(signal.SIGTERM)  # reaped: never a signal to a recycled pid
    assert not alive(victim.proc.pid)

    # its output goes to its own log: `kill -USR1` has it print its tasks on stderr (serve's
    # handler, installed in the child: the fork server's own handlers are not what it runs)
    log = sup.log_dir / "n00-npu0.log"
    sup.running["n00-npu0"].proc.send_signal(signal.SIGUSR1)
    await until(lambda: "tasks on SIGUSR1" in log.read_text())
    assert "tasks on SIGUSR1" not in (sup.log_dir / "n00-npu1.log").read_text()

    await sup.stop()
    for name, proc in procs.items():
        assert proc.returncode is not None and not alive(proc.pid), name
    assert not alive(server_pid)  # the fork server stops with the supervisor...
    assert exits == [victim]  # ...and neither it nor a stopped process counts as a death


async def test_a_bad_argv_or_env_is_a_death_with_its_code(fabric: Fabric) -> None:
    """The must-fail twin: an unknown device, or an environment no serve accepts, exits 1,
    reported as a death with its code and its log's reason."""
    sup, topology, path, exits = fabric
    no_epoch = path.parent / "no-epoch.json"
    no_epoch.write_text(dataclasses.replace(topology, epoch_wall_s=None).to_json())
    npu = topology.device("n00-npu2")
    await sup.start(
        [
            spec(path, "device", "n99-npu0", npu.address),
            spec(no_epoch, "device", npu.id, npu.address, env={EPOCH_ENV: "soon"}),
        ]
    )
    await until(lambda: len(exits) == 2)
    assert {r.spec.name: r.returncode for r in exits} == {"n99-npu0": 1, "n00-npu2": 1}
    assert "no device 'n99-npu0'" in (sup.log_dir / "n99-npu0.log").read_text()
    # the environment the request carried, not the fork server's (which has no $CMEMU_EPOCH)
    assert "not a number" in (sup.log_dir / "n00-npu2.log").read_text()
    with pytest.raises(UnavailableError, match="exited during start"):
        sup.check_alive()


async def test_a_dead_fork_server_fails_the_next_start(fabric: Fabric) -> None:
    sup, topology, path, exits = fabric
    assert sup.fork_server is not None
    sup.fork_server.proc.kill()
    await sup.fork_server.proc.wait()
    npu = topology.device("n00-npu0")
    with pytest.raises(UnavailableError, match="fork server"):
        async with asyncio.timeout(30):  # a clear error, not a hang
            await sup.start([spec(path, "device", npu.id, npu.address)])
    fabric_proc = sup.running["fabric"].proc
    assert fabric_proc.returncode is None  # what it forked runs on, owned as before
    await sup.stop()
    assert fabric_proc.returncode is not None and not exits  # the fork server is no death
    assert (sup.log_dir / FORK_SERVER_LOG).exists()


def test_the_off_switch() -> None:
    assert fork_wanted({}) and fork_wanted({"CMEMU_FORK": "1"})
    assert not fork_wanted({"CMEMU_FORK": "0"})
    with pytest.raises(InvalidArgumentError, match="CMEMU_FORK"):
        fork_wanted({"CMEMU_FORK": "no"})


def test_the_fork_server_imports_the_serve_path_and_nothing_else() -> None:
    """What it preloads (emulator/cli/forkserve.py) is what a serve process imports: the serve
    command, not the CLI's other verbs nor anything a device process does without; and it has
    one thread after it (no gRPC core, no pool) so that nothing is shared by a fork."""
    probe = (
        "import sys, json\n"
        "from cmemu.emulator.cli import forkserve\n"
        "from cmemu.emulator.runtime.forkserver import threads\n"
        "forkserve.preload()\n"
        "print(json.dumps([threads(), sorted(m for m, v in sys.modules.items() if v)]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    count, modules = json.loads(out)
    assert count == 1
    assert "cmemu.emulator.cli.serve" in modules and "cmemu.emulator.engines.device.ub" in modules
    tops = {m.split(".")[0] for m in modules}
    assert not tops & {*HEAVY, *NO_BROKER, "rich", "yaml"}, sorted(tops & {*HEAVY, *NO_BROKER})
    assert not set(modules) & set(UNCALLED)
    cli = {m for m in modules if m.startswith("cmemu.emulator.cli.")}
    assert cli == {
        f"cmemu.emulator.cli.{m}" for m in ("argtypes", "entry", "forkserve", "main", "serve")
    }
