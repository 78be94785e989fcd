"""Import only what runs (issue 18 item 9): a device process (`cmemu serve --device`, what each
of hundreds of containers runs) imports neither numpy, aiohttp nor prometheus-client, and still
serves its /metrics; `cmemu --version` imports nothing of the emulator (test_docker_units); a
`cmemu up` that serves its own broker imports no MQTT client."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmemu.emulator.client import h2probe
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.topology import metrics_address
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.supernode import LaunchOptions
from cmemu.emulator.testing import free_port_block, launch_ports

DEVICE_KINDS = "cmemu.emulator.engines.device.kinds"
FABRIC_KINDS = "cmemu.emulator.model.faults.fabric"
HEAVY = ("numpy", "aiohttp", "prometheus_client", "matplotlib", "jsonschema")
# with no broker in its topology (as here), no MQTT client: aiomqtt brings paho, and paho
# urllib.request, http.client and email (about 2.5 MB of PSS)
NO_BROKER = ("aiomqtt", "paho", "email", "http")
# and no client of the control plane it never calls, nor the heap report's XML (a device's PSS)
UNCALLED = (
    "cmemu.v1.router_pb2_grpc",
    "cmemu.v1.scheduler_pb2_grpc",
    "cmemu.v1.training_pb2_grpc",
    "cmemu.v1.gateway_pb2_grpc",
    "cmemu.emulator.client.control",
    "cmemu.emulator.model.scheduler",
    "xml.etree.ElementTree",
    "cmemu.emulator.model.ems",  # the EMS model: a device reaches EMS through its client only
    "cmemu.emulator.runtime.docker",  # the engine's view of containers: docker mode's launcher
)


async def test_a_device_process_imports_only_what_it_serves(tmp_path: Path) -> None:
    servers = launch_ports("cm-mini")
    base = free_port_block(servers + 1)  # and the port after them: the process's /metrics
    options = LaunchOptions(preset="cm-mini", mode=Procs(plan=PortPlan(base_port=base)))
    topology = dataclasses.replace(options.topology(), metrics_port=base + servers)
    path = tmp_path / "topology.json"
    path.write_text(topology.to_json())
    device = topology.device("n00-npu3")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "cmemu.emulator.cli.entry",
        "serve", "--topology", str(path), "--device", device.id,
        env={**os.environ, "CMEMU_EPOCH": "1.0"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            while True:
                try:
                    if await asyncio.to_thread(h2probe.check, device.address) == 1:
                        break
                except (OSError, h2probe.ProbeError):
                    pass
                assert proc.returncode is None, "the device process exited"
                await asyncio.sleep(0.2)
        metrics = metrics_address(topology, device.address)
        assert metrics is not None
        host, _, port = metrics.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = (await reader.read()).decode()
        writer.close()
        assert reply.startswith("HTTP/1.1 200")
        assert 'cmemu_device_healthy{supernode="sn0",device="n00-npu3"' in reply
        assert "process_resident_memory_bytes" in reply
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await proc.communicate()
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in err.decode().splitlines()
        if line.startswith("import time:") and "|" in line
    }
    imported = {m.split(".")[0] for m in modules}
    assert "grpc" in imported  # the report is there: it serves gRPC
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert topology.broker is None
    assert not imported & set(NO_BROKER), sorted(imported & set(NO_BROKER))
    assert not modules & set(UNCALLED), sorted(modules & set(UNCALLED))


@contextlib.asynccontextmanager
async def _up(*argv: str, state: Path) -> AsyncIterator[list[str]]:
    """A `cmemu up` run by this interpreter with `argv`, until it has written `state`, then
    stopped with SIGINT; the list yielded holds its stderr's lines once it has stopped."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    err: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not state.exists():  # noqa: ASYNC240 - one stat a poll, in a test
                assert proc.returncode is None, "cmemu up exited"
                await asyncio.sleep(0.05)
        yield err
    finally:
        proc.send_signal(signal.SIGINT)
        _, out = await proc.communicate()
        err.extend(out.decode().splitlines())


async def _up_modules(tmp_path: Path, *broker: str) -> set[str]:
    """The top-level modules a `cmemu up` of cm-mini in one process imported by its stop, a
    moment after its state file (its `started` events published by then), with no web view."""
    state = tmp_path / "state.json"
    base = free_port_block(launch_ports("cm-mini"))
    async with _up(
        "-X", "importtime", "-m", "cmemu.emulator.cli.entry", "--log-level", "warning", "up",
        "--preset", "cm-mini", "--base-port", str(base), "--ui", "none", *broker,
        "--state-file", str(state), state=state,
    ) as err:  # fmt: skip
        await asyncio.sleep(1.0)  # its events leave; nothing here depends on how many
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in err
        if line.startswith("import time:") and "|" in line
    }


async def test_a_process_serving_its_own_broker_imports_no_mqtt_client(tmp_path: Path) -> None:
    """Its publisher hands the events to the embedded broker (runtime/broker.py in_process);
    the twin, a broker of another process, is published to through aiomqtt (and paho)."""
    own = await _up_modules(tmp_path / "own")
    assert "grpc" in own and not own & {"aiomqtt", "paho"}, sorted(own & {"aiomqtt", "paho"})
    async with Broker() as elsewhere:  # this test's process, not the emulator's
        other = await _up_modules(tmp_path / "other", "--broker", elsewhere.url)
    assert {"aiomqtt", "paho"} <= other


def _imported_by(*argv: str) -> set[str]:
    done = subprocess.run(  # `status` with no instance exits 1: its imports are the point
        [sys.executable, "-X", "importtime", *argv],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_cmemu_status_imports_no_numpy(tmp_path: Path) -> None:
    """Every `cmemu` command is a process start (the tests make hundreds): `status` and `fault`
    read fault kinds, and the checkpoint-corrupt kind's training client brought the day plans'
    model and with it numpy (0.15 s of each start). Its twin: the day plans' policy model
    (model/dayplan.py, which the day plans' client brought until its night window moved to
    model/daywindow.py) does."""
    status = _imported_by(
        "-m", "cmemu.emulator.cli.entry", "status", "--state-file", str(tmp_path / "none.json")
    )
    assert "cmemu" in status and "numpy" not in status
    assert "numpy" in _imported_by("-c", "import cmemu.emulator.model.dayplan")


# `cmemu up` run with a spy on the import system: it says, on stderr, whether the state file was
# there when each module named first after the code (`-c FIRST_IMPORT A,B up ...`) was imported
FIRST_IMPORT = """
import sys
from pathlib import Path

modules = set(sys.argv.pop(1).split(","))
state = Path(sys.argv[sys.argv.index("--state-file") + 1])


class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in modules:
            print(f"{name} first imported; state file there: {state.exists()}", file=sys.stderr)
            modules.remove(name)
        return None


sys.meta_path.insert(0, Spy())
from cmemu.emulator.cli.entry import main

sys.exit(main(sys.argv[1:]))
"""


async def test_cmemu_up_imports_aiohttp_after_its_state_file(tmp_path: Path) -> None:
    """aiohttp's import is 0.2 s of CPU, a fifth of a cm384 boot: the web view and the router's
    OpenAI endpoint bind their sockets before the state file and serve after it. Its twin: both
    then answer (a request made at once is served, aiohttp imported by then)."""
    import aiohttp

    from cmemu.emulator.model.topology import ServiceKind
    from cmemu.emulator.runtime import state

    path = tmp_path / "state.json"
    base = free_port_block(launch_ports("cm-mini"))
    async with _up(
        "-c", FIRST_IMPORT, "aiohttp", "--log-level", "warning", "up", "--preset", "cm-mini",
        "--base-port", str(base), "--broker", "none", "--state-file", str(path), state=path,
    ) as err:  # fmt: skip
        found = state.read_instance(path)
        router = found.topology.service(ServiceKind.ROUTER).http_address
        ui = found.launcher.extra[state.UI_KEY]
        assert router is not None and ui
        async with aiohttp.ClientSession() as session, asyncio.timeout(60):
            async with session.get(f"http://{router}/health") as response:
                assert response.status == 200
            async with session.get(f"{ui}api/snapshot") as response:
                assert response.status == 200
    said = [line for line in err if "aiohttp first imported" in line]
    assert said == ["aiohttp first imported; state file there: True"], said


# what a boot of cm384 imports only after its state file, at their first use: numpy (85 ms of
# CPU) with the fabric's link graph, and a fault kind's module with its first fault
LATER = ("numpy", f"{DEVICE_KINDS}.slow", f"{FABRIC_KINDS}.link_down")


async def test_cmemu_up_imports_numpy_and_fault_kinds_after_its_state_file(tmp_path: Path) -> None:
    """Only the fabric's link graph, its flows and collectives use numpy, and they are made
    after the state file (engines/fabric/lazygraph.py), their modules imported there; a fault
    kind's module is imported with the kind's first use (emulator/model/faults/table.py). cm384
    in one process, every service. Its twins: the fabric's first transfer after the start is
    served and a device's and a link's fault are injected, each module imported by then (the
    spy says so), and a listing of a plane's kinds imports every kind's module."""
    from cmemu.emulator.client import faults
    from cmemu.emulator.client.clients import Clients
    from cmemu.emulator.client.fabric import FabricClient
    from cmemu.emulator.runtime import state

    path = tmp_path / "state.json"
    base = free_port_block(launch_ports("cm384"))
    async with _up(
        "-c", FIRST_IMPORT, ",".join(LATER), "--log-level", "warning", "up", "--preset", "cm384",
        "--base-port", str(base), "--state-file", str(path), state=path,
    ) as err:  # fmt: skip
        clients = Clients(state.read_instance(path).topology)
        try:
            async with asyncio.timeout(60):
                done = await FabricClient(clients).xfer("n00-npu0", "n01-npu3", 1 << 20)
                await faults.inject(clients, "slow", "n00-npu1", {"compute": "0.5"})
                await faults.inject(clients, "link-down", "n00-npu0.d0~n00-l1s0")
        finally:
            await clients.close()
        assert done.completion.complete_ns > done.completion.issue_ns
        assert len(done.completion.path) == 5  # across the L2 tier: the graph routed it
    said = sorted(line for line in err if "first imported" in line)
    assert said == sorted(f"{m} first imported; state file there: True" for m in LATER), said
    graph = _modules_of("import cmemu.emulator.model.linkgraph")
    assert "numpy" in {m.split(".")[0] for m in graph}
    listed = _loaded_by(f"from {FABRIC_KINDS} import KINDS; list(KINDS.values())")
    assert {f"{FABRIC_KINDS}.{m}" for m in ("link_down", "l1_board", "rank_slow")} <= listed


def _modules_of(code: str) -> set[str]:
    """Every module `python -c code` imports (their full names)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def _loaded_by(code: str) -> set[str]:
    """Every module in sys.modules once `python -c code` has run: with those imported through
    importlib.import_module (a fault kind's, emulator/model/faults/table.py), which -X importtime
    does not report (it times the import statement's imports only)."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(*sys.modules)"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return set(done.stdout.split())


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A module every boot imports (`module`, which brings `present`), and modules it leaves to
    their first use (`heavy`); the twin, `twin`, is a module that does bring them."""

    module: str
    present: str
    heavy: frozenset[str]
    twin: str


DEFERRED = {
    # the scheduler runs day plans (model/daylive.py): their night window is model/daywindow's,
    # not the calendar policy's model (model/dayplan.py, the training cost models under it)
    "scheduler-day-plans": Deferred(
        "cmemu.emulator.engines.scheduler.engine",
        "cmemu.emulator.model.daywindow",
        frozenset({"cmemu.emulator.model.dayplan"}),
        "cmemu.emulator.cli.simulate",
    ),
    # the router's serving engine: the drivers, the serving model and its cost models (30 ms of
    # imports) come with the first deployment (engines/serving/engine.py imports them there)
    "router-deployments": Deferred(
        "cmemu.services.router",
        "cmemu.emulator.engines.serving.engine",
        frozenset(
            {
                "cmemu.emulator.engines.serving.driver",
                "cmemu.emulator.model.serving.engine",
                "cmemu.emulator.model.serving.deployment",
            }
        ),
        "cmemu.emulator.engines.serving.deploy",
    ),
    # the training service: a job's runner, its step model and the training cost models under
    # it come with the first job started
    "training-jobs": Deferred(
        "cmemu.services.training.service",
        "cmemu.emulator.engines.training.engine",
        frozenset(
            {
                "cmemu.emulator.model.training.job",
                "cmemu.emulator.model.training.step",
                "cmemu.emulator.model.serving.cost",
            }
        ),
        "cmemu.emulator.engines.training.runner",
    ),
    # the web view binds before the state file: the router's client and its deployments'
    # records come with the serving feed, which starts after it (collector.py `_serving`)
    "web-view-serving-feed": Deferred(
        "cmemu.emulator.runtime.webview.collector",
        "cmemu.emulator.client.fabric",
        frozenset({"cmemu.emulator.client.router", "cmemu.emulator.client.deployments"}),
        "cmemu.emulator.cli.serving",
    ),
}


@pytest.mark.parametrize("name", DEFERRED)
def test_what_every_boot_imports_leaves_the_heavy_modules_to_their_first_use(name: str) -> None:
    deferred = DEFERRED[name]
    imported = _modules_of(f"import {deferred.module}")
    assert deferred.present in imported
    assert not imported & deferred.heavy, sorted(imported & deferred.heavy)
    assert deferred.heavy <= _modules_of(f"import {deferred.twin}")  # the twin brings them
