"""Hundreds of containers, proven without a Docker engine: the compose file's own commands and
process mode run as real OS processes on their own loopback addresses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import (
    CMEMU,
    MINI_DEVICES,
    MINI_PORTS,
    MINI_SERVERS,
    cmemu_up,
    free_port_block,
    run_cmemu,
)
from cmemu.v1 import device_pb2, device_pb2_grpc, ems_pb2, ems_pb2_grpc, fabric_pb2, fabric_pb2_grpc

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


run = run_cmemu


def processes_under(tmp: Path) -> dict[int, list[str]]:
    """Every process with an argument in `tmp` (a file of its run directory), by pid: those
    of the `cmemu up` run with $TMPDIR=`tmp`, not those of other tests running at the same
    time (pytest-xdist workers) nor of other users of the machine."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_text().split("\0")
        except OSError:  # not a process, or it exited meanwhile
            continue
        if proc.name.isdigit() and any(a.startswith(f"{tmp}/") for a in argv):
            found[int(proc.name)] = argv
    return found


def serve_processes(tmp: Path) -> list[int]:
    """The `cmemu serve` processes of the `cmemu up` run with $TMPDIR=`tmp`."""
    return [
        pid for pid, argv in processes_under(tmp).items() if CMEMU in argv[:2] and "serve" in argv
    ]


def kill_left_over(tmp: Path) -> None:
    """After a failed test: whatever its `cmemu up` left running, so that it does not hold
    the fixed addresses the next test binds."""
    for pid in processes_under(tmp):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def up(
    state_file: Path, *args: str, output: list[str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """`cmemu up` with its temporary files (the run directory) beside the state file."""
    tmp = state_file.parent
    try:
        with cmemu_up(state_file, *args, output=output, env={"TMPDIR": str(tmp)}) as proc:
            yield proc
        assert not serve_processes(tmp), "a serve process outlived its supervisor"
    finally:
        kill_left_over(tmp)


@pytest.mark.xdist_group("loopback-compose")  # 127.60.x.y, compose's: see tests/conftest.py
def test_cm_mini_from_its_compose_file(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    output: list[str] = []
    compose_file = str(ROOT / "compose" / "cm-mini.yaml")
    with up(state_file, "--from-compose", compose_file, output=output) as proc:
        topology = json.loads(state_file.read_text())
        ls = run("ls", "--state-file", str(state_file), "--json")
        rows = json.loads(ls.stdout)
        assert len(rows) == MINI_SERVERS and {r["health"] for r in rows} == {"SERVING"}
        assert all(r["address"].startswith("127.60.") for r in rows)
        pids = serve_processes(tmp_path)
        assert len(pids) == MINI_SERVERS  # every device and service, each its own process

        npu = next(d for d in topology["devices"] if d["id"] == "n01-npu2")
        listing = subprocess.run(
            [str(BIN / "grpcurl"), "-plaintext", npu["address"], "cmemu.v1.Device/GetInfo"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert json.loads(listing.stdout)["id"] == "n01-npu2"

        xfer = run(
            "xfer",
            "n00-npu0",
            "n01-mem",
            "--bytes",
            "4096",
            "--state-file",
            str(state_file),
            "--json",
        )
        assert xfer.returncode == 0, xfer.stderr
        assert json.loads(xfer.stdout)["planes"] == 7  # through the fabric's own process

        victim = next(d for d in topology["devices"] if d["id"] == "n00-npu3")
        victim_pid = next(
            p
            for p in pids
            if "--device n00-npu3" in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")
        )
        os.kill(victim_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while run("probe", victim["address"], "--timeout", "1").returncode != 3:
            assert time.monotonic() < deadline, "the killed device still answers"
        rows = json.loads(run("ls", "--state-file", str(state_file), "--json").stdout)
        down = [r["id"] for r in rows if r["health"] != "SERVING"]
        assert down == ["n00-npu3"]
        # the others keep serving, and a transfer to the dead device fails cleanly
        dead = run("xfer", "n00-npu0", "n00-npu3", "--bytes", "8", "--state-file", str(state_file))
        assert dead.returncode == 1 and "UNAVAILABLE" in dead.stderr
        assert proc.poll() is None  # nothing restarted it, nothing else stopped
    out = output[0]
    assert "process n00-npu3" in out and "not restarted" in out
    assert "cmemu: stopped" in out


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_process_mode_per_node(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with up(state_file, "--preset", "cm-mini", "--mode", "procs", "--per", "node"):
        # two nodes and the supernode-wide services (cm-mini has no gateway: no RDMA plane)
        assert len(serve_processes(tmp_path)) == 2 + MINI_SERVERS - MINI_DEVICES
        rows = json.loads(run("ls", "--state-file", str(state_file), "--json").stdout)
        assert len(rows) == MINI_SERVERS and {r["health"] for r in rows} == {"SERVING"}
        assert len({r["address"] for r in rows}) == MINI_SERVERS  # one loopback address each
        xfer = run(
            "xfer",
            "n00-npu1",
            "n01-npu1",
            "--bytes",
            "1000000",
            "--state-file",
            str(state_file),
            "--json",
        )
        assert xfer.returncode == 0, xfer.stderr


def test_serve_refuses_what_it_cannot_serve(tmp_path: Path) -> None:
    topology = tmp_path / "t.json"
    subprocess.run(
        [CMEMU, "topology", "--preset", "cm-mini", "--json"], stdout=topology.open("w"), check=True
    )
    env_free = {k: v for k, v in os.environ.items() if k != "CMEMU_EPOCH"}
    cases = [
        (["--device", "n00-npu0", "--clock-wait", "0.5"], "did not tell its clock within 0.5 s"),
        (["--device", "n99-npu0"], "no device 'n99-npu0'"),
        (["--node", "n42"], "no node 'n42'"),
        (["--service", "nosuch"], "no service 'nosuch'"),
    ]
    for args, words in cases:
        env = env_free if "clock" in words else {**env_free, "CMEMU_EPOCH": "1"}
        result = subprocess.run(
            [CMEMU, "serve", "--topology", str(topology), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 1 and words in result.stderr, (args, result.stderr)
    missing = run("serve", "--topology", str(tmp_path / "nope.json"), "--device", "n00-npu0")
    assert missing.returncode == 1 and "cannot read topology" in missing.stderr
    bad_epoch = subprocess.run(
        [CMEMU, "serve", "--topology", str(topology), "--device", "n00-npu0"],
        capture_output=True,
        text=True,
        env={**env_free, "CMEMU_EPOCH": "soon"},
        timeout=60,
        check=False,
    )
    assert bad_epoch.returncode == 1 and "not a number" in bad_epoch.stderr


HEAD_START_S = 3.0  # the device starts this long before the fabric


def test_without_an_epoch_every_process_takes_the_fabrics(tmp_path: Path) -> None:
    """What `docker compose up` does with no $CMEMU_EPOCH: the fabric takes the epoch when it
    starts, and a device started later asks it for the clock rather than starting its own."""
    doc = json.loads(run("topology", "--preset", "cm-mini", "--json").stdout)
    assert doc["epoch_wall_s"] is None
    base = free_port_block(MINI_PORTS)
    for i, server in enumerate(doc["devices"] + doc["services"]):
        server["address"] = f"127.0.0.1:{base + i}"
    doc["metrics_port"] = None  # two processes on one host: only one could serve it
    topology = tmp_path / "t.json"
    topology.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != "CMEMU_EPOCH"}
    fabric_address = next(s["address"] for s in doc["services"] if s["id"] == "fabric")
    device_address = doc["devices"][0]["address"]

    def serve(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [CMEMU, "serve", "--topology", str(topology), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    procs = [serve("--device", doc["devices"][0]["id"])]  # before the fabric: it keeps asking
    try:
        time.sleep(HEAD_START_S)
        procs.append(serve("--service", "fabric"))
        for address in (fabric_address, device_address):
            deadline = time.monotonic() + 60
            while run("probe", address, "--timeout", "1").returncode != 0:
                assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
                time.sleep(0.2)

        async def clocks() -> tuple[fabric_pb2.ClockInfo, int, int]:
            async with (
                grpc.aio.insecure_channel(fabric_address) as f,
                grpc.aio.insecure_channel(device_address) as d,
            ):
                fabric = fabric_pb2_grpc.FabricStub(f)
                before = await fabric.GetClock(fabric_pb2.GetClockRequest())
                sample = await device_pb2_grpc.DeviceStub(d).GetTelemetry(
                    device_pb2.GetTelemetryRequest()
                )
                after = await fabric.GetClock(fabric_pb2.GetClockRequest())
            return before, sample.emulated_ns, after.emulated_ns

        before, device_ns, after_ns = asyncio.run(clocks())
        assert abs(time.time() - before.epoch_wall_s) < 30  # the fabric took it when it started
        # The device reads the fabric's time, read around it (emulated, so the host's load does
        # not move it): a clock of its own would run HEAD_START_S ahead. A follower may lead the
        # fabric for a moment (it extrapolates while the fabric stalls), never by that much.
        slack_ns = round(HEAD_START_S / 2 * 1e9)
        assert before.emulated_ns - slack_ns <= device_ns <= after_ns + slack_ns
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


def _ems_puts(state_file: Path, objects: dict[str, bytes], device: str) -> None:
    """Each object Put (its bytes inline, as `cmemu ems put` sends objects this small) from
    `device`, through one client: the CLI's own runs are tests/cli/test_ems_cli.py's."""

    async def go() -> None:
        clients = state.clients(state_file)
        try:
            ems = ems_pb2_grpc.EmsStub(
                clients.channel_to(clients.topology.service(ServiceKind.EMS).address)
            )
            for key, data in objects.items():
                await ems.Put(ems_pb2.PutRequest(key=key, data=data, device=device))
        finally:
            await clients.close()

    asyncio.run(go())


def _ems_gets(state_file: Path, keys: list[str]) -> dict[str, bytes]:
    """Each object's bytes read back (GetStream, as `cmemu ems get`), through one client."""

    async def go() -> dict[str, bytes]:
        clients = state.clients(state_file)
        try:
            ems = ems_pb2_grpc.EmsStub(
                clients.channel_to(clients.topology.service(ServiceKind.EMS).address)
            )
            got = {}
            for key in keys:
                chunks = [c.data async for c in ems.GetStream(ems_pb2.GetRequest(key=key))]
                got[key] = b"".join(chunks)
            return got
        finally:
            await clients.close()

    return asyncio.run(go())


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_ems_loses_nothing_when_a_pool_dies_or_ems_restarts(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with up(state_file, "--preset", "cm-mini", "--mode", "procs", "--per", "node"):
        state = ["--state-file", str(state_file)]
        objects = {f"key-{i}": bytes([i]) * (1000 + i) for i in range(8)}
        _ems_puts(state_file, objects, "n01-npu1")  # each Put raises on a failure
        pid_of = {
            " ".join(Path(f"/proc/{p}/cmdline").read_text().split("\0")): p
            for p in serve_processes(tmp_path)
        }
        node = next(p for cmd, p in pid_of.items() if "--node n00" in cmd)
        os.kill(node, signal.SIGKILL)  # node n00's pool dies with every copy it held
        assert _ems_gets(state_file, list(objects)) == objects

        ems_cmd, ems_pid = next((c, p) for c, p in pid_of.items() if "--service ems" in c)
        os.kill(ems_pid, signal.SIGKILL)  # EMS dies with all its metadata
        assert run("ems", "stat", *state).returncode == 1
        restarted = subprocess.Popen(
            [*ems_cmd.split(), "--rebuild-wait", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            topology = json.loads(state_file.read_text())
            ems_address = next(s["address"] for s in topology["services"] if s["id"] == "ems")
            deadline = time.monotonic() + 60
            while run("probe", ems_address, "--timeout", "1").returncode != 0:
                assert restarted.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            stat = json.loads(run("ems", "stat", "--json", *state).stdout)
            assert int(stat["objects"]) == 8  # rebuilt from the surviving pool's region labels
            assert _ems_gets(state_file, list(objects)) == objects
        finally:
            restarted.send_signal(signal.SIGTERM)
            restarted.wait(timeout=30)


def test_from_compose_without_mosquitto_says_so(tmp_path: Path) -> None:
    """No mosquitto installed: a clear message and exit 1, no traceback, no run directory."""
    state_file = tmp_path / "state.json"
    result = subprocess.run(
        [
            CMEMU,
            "up",
            "--from-compose",
            str(ROOT / "compose" / "cm-mini.yaml"),
            "--state-file",
            str(state_file),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CMEMU_MOSQUITTO": str(tmp_path / "no" / "mosquitto")},
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "runs mosquitto" in result.stderr and "apt-get install mosquitto" in result.stderr
    assert "--broker none" in result.stderr
    assert not list(tmp_path.iterdir())  # no run directory left behind
