"""`docker compose up` for real (issue 22): cm-mini, one container per device, through the local
Docker engine and the image `cmemu image build` made without a registry (.ci/run builds it).

One boot serves every check, in order: every container healthy; grpcurl `list` and a UB write
then read from the host; an EMS put and get; MQTT events on the broker's host listener; a
container kill and a network partition as fault kinds, seen by the cluster manager (and the kill
as a `died` event with its exit code); a 10-emulated-minute chaos scenario of container faults
that passes, and its twin that must fail; and at the end `docker compose down` leaving no
container, network or volume of the project behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from cmemu.emulator.client.faults import attach_engine, clear, inject
from cmemu.emulator.model.chaos.pace import ABORTED, FAIL, PASS
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.runtime import image
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.emulator.runtime.docker import PROJECT_LABEL, engine_answers
from cmemu.emulator.runtime.launchmodes import Docker
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import grpcurl
from cmemu.v1 import ems_pb2, ems_pb2_grpc, manager_pb2
from tests.runtime.test_mqtt import listening

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("loopback-docker")]
PROJECT = f"cmemu-test-{os.getpid()}"
OCTET = 64  # 127.64.x.y: this test's published addresses
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
T = TypeVar("T")


def _skip_without_engine() -> None:
    if engine_answers() is None:
        pytest.skip("no Docker engine answers here")
    if image.image_labels(image.IMAGE) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds {image.IMAGE} first (.ci/run: cmemu image build)")
        pytest.skip(f"no {image.IMAGE}: run `cmemu image build` first")


def _left(kind: str) -> list[str]:
    listing = ["ls", "-aq"] if kind == "container" else ["ls", "-q"]
    out = subprocess.run(
        ["docker", kind, *listing, "--filter", f"label={PROJECT_LABEL}={PROJECT}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split()


def _containers() -> list[dict[str, object]]:
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={PROJECT_LABEL}={PROJECT}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not ids:
        return []
    docs: list[dict[str, object]] = json.loads(
        subprocess.run(["docker", "inspect", *ids], capture_output=True, check=True).stdout
    )
    return docs


async def _retrying(call: Callable[[], Awaitable[T]], within_s: float = 60.0) -> T:
    """A call retried while it is UNAVAILABLE, as its RetryInfo invites: on a loaded machine
    EMS's half-emulated-second pool sweeps (25 ms of wall time at time scale 20) can find a
    pool late for a moment just after the start."""
    async with asyncio.timeout(within_s):
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
            await asyncio.sleep(0.5)


async def _judged(sn: Supernode, scenario: str, options: RunOptions) -> RunResult:
    """A run with a verdict: one ABORTED (the host did not let the emulator keep pace, which
    the suite's other workers can do to 32 containers on 2 cores) judged nothing and is run
    again, up to three times in all."""
    for _ in range(3):
        result = await run_scenario(sn.clients, files.load(SCENARIOS / scenario), options)
        if result.outcome != ABORTED:
            return result
    assert result.pace is not None
    pytest.fail(f"{scenario}: ABORTED three times: {result.pace.aborted}")


async def _incident_for(
    sn: Supernode, device: str, *, state: str = "", within_s: float = 120.0
) -> None:
    """Until the manager has an incident for `device` (in `state`, when given); a timeout says
    what the manager had and the container's networks."""
    seen: list[str] = []
    try:
        async with asyncio.timeout(within_s):
            while True:
                request = manager_pb2.ListIncidentsRequest()
                listed = await sn.clients.manager().ListIncidents(request)
                seen = [f"{i.device} {i.state} {i.detail}" for i in listed.incidents]
                if any(i.device == device and state in ("", i.state) for i in listed.incidents):
                    return
                await asyncio.sleep(0.5)
    except TimeoutError:
        containers = _containers()
        networks = [c.get("NetworkSettings") for c in containers if device in str(c["Name"])]
        _dump_tasks([str(c["Id"]) for c in containers if "manager" in str(c["Name"])])
        await asyncio.sleep(2.0)
        logs = {
            str(c["Name"]): _tail_log(str(c["Id"]))
            for c in containers
            if device in str(c["Name"]) or "manager" in str(c["Name"])
        }
        pytest.fail(f"no {state or 'incident'} for {device}: {seen}; {networks}; logs: {logs}")


def _dump_tasks(containers: list[str]) -> None:
    """Each container's tasks, to the frame each waits in, into its log (taskdump, SIGUSR1)."""
    for container in containers:
        subprocess.run(["docker", "kill", "--signal", "USR1", container], check=False)


def _tail_log(container: str, lines: int = 120) -> str:
    out = subprocess.run(["docker", "logs", "--tail", str(lines), container],
                         capture_output=True, text=True, check=False)  # fmt: skip
    return out.stdout + out.stderr


@pytest.mark.engine
async def test_cm_mini_per_device_through_the_engine(tmp_path: Path) -> None:  # noqa: PLR0915
    _skip_without_engine()
    options = LaunchOptions(
        preset="cm-mini",
        mode=Docker(per="device", project=PROJECT, engine_octet=OCTET, run_dir=tmp_path / "run"),
        time_scale=10.0,
        ready_timeout_s=600.0,
    )
    try:
        async with Supernode.start(options) as sn:
            assert sn.engine is not None
            containers = _containers()
            assert len(containers) == 26 + 5 + 1  # devices, services, the broker
            for c in containers:
                state = c["State"]
                assert isinstance(state, dict) and state["Status"] == "running"
                if "Health" in state:  # the broker has no healthcheck
                    assert state["Health"]["Status"] == "healthy", c["Name"]

            # grpcurl from the host, and a UB write then a read from the other node
            npu0, npu1 = sn.address("n00-npu0"), sn.address("n00-npu1")
            code, out, err = await grpcurl(npu0, "list")
            assert code == 0 and "cmemu.v1.UnifiedBus" in out, err
            token = ["-H", f"authorization: Bearer {sn.security.token}"]
            code, out, err = await grpcurl(
                *token, "-d", '{"size": 4096}', npu0, "cmemu.v1.Device/AllocateRegion"
            )
            assert code == 0, err
            eid = json.loads(out)["eid"]
            write = {"op": "UB_OP_WRITE", "dst": {"eid": eid, "offset": 0}, "data": "aGVsbG8="}
            code, out, err = await grpcurl(
                *token, "-d", json.dumps(write), npu1, "cmemu.v1.UnifiedBus/Submit"
            )
            assert code == 0, err
            read = {"op": "UB_OP_READ", "dst": {"eid": eid, "offset": 0}, "size": 5}
            code, out, err = await grpcurl(
                *token, "-d", json.dumps(read), sn.address("n01-npu4"), "cmemu.v1.UnifiedBus/Submit"
            )
            assert code == 0 and json.loads(out)["data"] == "aGVsbG8=", err
            # an unauthenticated write is refused (the compose file's token guards the state)
            code, _, err = await grpcurl(
                "-d", json.dumps(write), npu1, "cmemu.v1.UnifiedBus/Submit"
            )
            assert code != 0 and "Unauthenticated" in err

            # EMS through its published address
            ems = ems_pb2_grpc.EmsStub(sn.clients.channel_to(sn.address("ems")))
            put = ems_pb2.PutRequest(key="docker/greeting", data=b"hello, engine")
            await _retrying(lambda: ems.Put(put))
            got = await _retrying(lambda: ems.Get(ems_pb2.GetRequest(key="docker/greeting")))
            assert got.data == b"hello, engine"

            # container faults, seen by the manager; the kill is a `died` event over MQTT
            attach_engine(sn.clients, sn.engine)
            assert sn.broker is not None
            async with listening(sn.broker, sn.security.mqtt_login()) as events:
                killed = await inject(sn.clients, "container-kill", "n01-npu3")
                await _incident_for(sn, "n01-npu3")
                await events.wait_for(lambda: events.named("n01-npu3", "died"))
                assert events.named("n01-npu3", "died")[0]["exit_code"] == 137
            cut = await inject(sn.clients, "container-disconnect", "n00-npu5")
            await _incident_for(sn, "n00-npu5")
            code, _, _ = await grpcurl(sn.address("n00-npu5"), "list", timeout_s=30)
            assert code != 0  # its published port went with its network
            await clear(sn.clients, cut.id)
            await clear(sn.clients, killed.id)  # started again
            # Both come back (a bound only). The restarted one follows the fabric's time from
            # its first segment (it once read a guess from the epoch, ahead of dilated time, and
            # stood still there, failed by silence every few wall s until isolated). The
            # reconnected one's liveness stream is opened again and beats (it once stayed
            # isolated: see emulator/engines/manager/liveness.py, FIRST_BEAT_WALL_S).
            await _incident_for(sn, "n01-npu3", state="restored", within_s=180.0)
            await _incident_for(sn, "n00-npu5", state="restored", within_s=180.0)
            # The storm below partitions a pool and holds its recovery to 10 emulated minutes.

            # a fault kind the emulator cannot apply says why, and nothing changes
            with pytest.raises(NotFoundError):
                await inject(sn.clients, "container-pause", "no-such-service")

            # 10 emulated minutes of container faults: the storm passes, its twin must fail
            passed = await _judged(sn, "container-storm.yaml", RunOptions(early_end=False))
            assert passed.outcome == PASS, [c for c in passed.verdict.checks if not c.ok]
            assert {i.kind for i in passed.observations.injections} == {
                "container-kill", "container-pause", "container-disconnect",
            }  # fmt: skip
            # it may end once everything it did is settled: the loss is seen by then
            failed = await _judged(sn, "container-storm-must-fail.yaml", RunOptions())
            assert failed.outcome == FAIL
            lost = next(c for c in failed.verdict.checks if c.name == "lost_objects")
            assert not lost.ok
    finally:
        left = {kind: _left(kind) for kind in ("container", "network", "volume")}
        assert left == {"container": [], "network": [], "volume": []}
