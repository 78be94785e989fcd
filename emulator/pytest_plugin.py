"""The cmemu pytest plugin (a `pytest11` entry point, so installing the package enables it).

Fixtures:
- `supernode`: a running emulator, started once per distinct (preset, mode, time_scale) for the
  session with `cmemu up` (any launcher mode) and stopped at the end. Choose it with a marker,
  `@pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=20)`, or indirect
  parametrisation (`@pytest.mark.parametrize("supernode", [{"time_scale": 50}], indirect=True)`).
  `fresh="test"` (or `"module"`) in either gives the test (the module) an emulator of its own,
  started for it and stopped after it, so that no state leaks between tests.
- `chaos`: runs a scenario (`chaos.run("scenarios/npu-crash-decode.yaml")` returns the verdict
  and the timeline) or injects a fault (`chaos.inject("device-down", "n00-npu3")`); whatever it
  injected is cleared after the test.
- `wait_for(condition, within_emulated_s)`: polls `condition` (a callable returning a bool, or an
  awaitable bool) until it holds, failing the test once the deadline passes in EMULATED time.

Options (command line, or the ini file: `cmemu_ports = 22000-32000`, `cmemu_preset = cm-mini`):
`--cmemu-ports FROM-TO`, the ports an in-process launch's block is searched in (a
slice of them per xdist worker); `--cmemu-preset NAME`, the preset when a test names none.

A run's result answers per-fault bounds in one line: `result.fault("crash").recovered_within(300)`
(or "5m"; `detected_within`, `recovery_s`), an AssertionError naming the fault and what happened.

Every call goes through the state file and gRPC, exactly as `cmemu chaos run` does; the fixtures'
methods are plain functions that work from sync and async tests alike (each runs its own event
loop on a worker thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faults import ActiveFault
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.presets import load_presets
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.chaos import files, kinds
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.emulator.testing import SEARCH_FROM, SEARCH_TO, free_port_block, launch_ports
from cmemu.v1 import fabric_pb2

T = TypeVar("T")
CMEMU = str(Path(sys.executable).parent / "cmemu")
START_TIMEOUT_S = 300.0
DEFAULTS: dict[str, Any] = {"preset": "cm-mini", "mode": "inprocess", "time_scale": 10.0}
POLL_WALL_S = 0.02
FRESH = ("session", "module", "test")  # how long one emulator serves: shared, or per module/test
PORTS_OPTION, PORTS_INI = "--cmemu-ports", "cmemu_ports"
PRESET_OPTION, PRESET_INI = "--cmemu-preset", "cmemu_preset"
PORTS_KEY = pytest.StashKey[tuple[int, int]]()
PRESET_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cmemu", "the cmemu emulator (supernode fixture)")
    group.addoption(
        PORTS_OPTION,
        dest="cmemu_ports",
        metavar="FROM-TO",
        help=f"ports the emulators' blocks are searched in (default {SEARCH_FROM}-{SEARCH_TO})",
    )
    group.addoption(
        PRESET_OPTION,
        dest="cmemu_preset",
        metavar="NAME",
        help=f"the preset when a test names none (default {DEFAULTS['preset']})",
    )
    parser.addini(PORTS_INI, f"as {PORTS_OPTION}", default="")
    parser.addini(PRESET_INI, f"as {PRESET_OPTION}", default="")


def parse_ports(text: str, where: str) -> tuple[int, int]:
    """`FROM-TO` (TO excluded) of unprivileged ports; a UsageError saying where it came from."""
    low, sep, high = text.strip().partition("-")
    if not (sep and low.strip().isdigit() and high.strip().isdigit()):
        raise pytest.UsageError(f"{where}: expected FROM-TO (e.g. 22000-32000), got {text!r}")
    bottom, top = int(low), int(high)
    if not 1024 <= bottom < top <= 65536:
        raise pytest.UsageError(
            f"{where}: {text!r}: need 1024 <= FROM < TO <= 65536 (TO is excluded)"
        )
    return bottom, top


def _configured(config: pytest.Config, option: str, ini: str, flag: str) -> tuple[str, str]:
    """(value, where it came from): the command line over the ini file; ("", "") for neither."""
    value = config.getoption(option)
    if value:
        return str(value), flag
    from_ini = str(config.getini(ini) or "")
    return (from_ini, f"ini {ini}") if from_ini else ("", "")


ASYNCIO_SCOPE = "asyncio_default_fixture_loop_scope"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("asyncio") and not config.getini(ASYNCIO_SCOPE):
        # pytest-asyncio (cmemu's dev extra brings it) warns at configure time in a project
        # that leaves this unset; the plugin's fixtures are synchronous and need no loop scope,
        # so a project that only uses them is not told to configure one. This one message
        # only, for the session (pytest runs configure under catch_warnings, restored at its
        # end); tryfirst: before pytest-asyncio's hook warns. A project that sets it is untouched.
        warnings.filterwarnings(
            "ignore",
            message=f'The configuration option "{ASYNCIO_SCOPE}" is unset',
            category=pytest.PytestDeprecationWarning,
        )
    config.addinivalue_line(
        "markers",
        "supernode(preset='cm-mini', mode='inprocess', time_scale=10.0, per='node', "
        "fresh='session'): the emulator the `supernode` fixture starts (cmemu pytest plugin); "
        "fresh='test' or 'module': one of its own, stopped after the test or module",
    )
    ports, where = _configured(config, "cmemu_ports", PORTS_INI, PORTS_OPTION)
    config.stash[PORTS_KEY] = parse_ports(ports, where) if ports else (SEARCH_FROM, SEARCH_TO)
    preset, where = _configured(config, "cmemu_preset", PRESET_INI, PRESET_OPTION)
    if preset and preset not in load_presets():
        raise pytest.UsageError(
            f"{where}: no preset {preset!r}; known: {', '.join(sorted(load_presets()))}"
        )
    config.stash[PRESET_KEY] = preset or str(DEFAULTS["preset"])


def _on_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a fresh event loop of a worker thread: callable from a
    sync test and from inside a running loop alike."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


@dataclass(kw_only=True)
class RunningSupernode:
    """A running emulator: where its state file is, its topology and emulated clock."""

    preset: str
    mode: str
    time_scale: float
    state_file: Path
    process: subprocess.Popen[bytes]

    @property
    def topology(self) -> Topology:
        return state.read(self.state_file)

    def now_s(self) -> float:
        """Emulated seconds since the supernode started, as its fabric (the owner of emulated
        time, which runs slower when the emulator cannot keep up) says."""

        async def ask(clients: Clients) -> float:
            info = await clients.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=30.0)
            return float(info.emulated_ns) / 1e9

        return self.call(ask)

    def clients(self) -> Clients:
        """Fresh typed clients (bound to the event loop that uses them: close them there)."""
        return Clients(self.topology, state.credentials(self.state_file))

    def call(self, use: Callable[[Clients], Awaitable[T]]) -> T:
        """`use(clients)` on a worker thread's own loop, the clients closed after."""

        async def go() -> T:
            clients = self.clients()
            try:
                return await use(clients)
            finally:
                await clients.close()

        return _on_thread(go)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_supernode(
    *,
    preset: str,
    mode: str,
    time_scale: float,
    per: str = "node",
    directory: Path,
    broker: bool = False,
    ports: tuple[int, int] = (SEARCH_FROM, SEARCH_TO),
    name: str = "",
) -> RunningSupernode:
    """`cmemu up` in the background, returned once its state file says every server SERVES;
    with `broker`, beside its own MQTT broker (what `cmemu up` starts by default); its ports a
    free block within `ports` (in-process mode; the others place their own)."""
    state_file = directory / f"{name or f'{preset}-{mode}-{time_scale:g}'}.json"
    args = [CMEMU, "--log-level", "warning", "up", "--preset", preset, "--mode", mode,
            "--time-scale", f"{time_scale:g}", "--state-file", str(state_file)]  # fmt: skip
    if not broker:
        args += ["--broker", "none"]
    if mode == "procs":
        args += ["--per", per]
    elif mode == "inprocess":  # ports: a free block, so sessions and emulators do not clash
        base = free_port_block(launch_ports(preset), search=ports)
        args += ["--base-port", str(base)]
    env = {**os.environ, "CMEMU_STATE_DIR": str(directory)}
    log = (directory / f"{state_file.stem}.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not state_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"cmemu up exited {proc.returncode}; see {log.name}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"cmemu up did not start within {START_TIMEOUT_S} s")
        time.sleep(0.05)
    return RunningSupernode(preset=preset, mode=mode, time_scale=time_scale,
                            state_file=state_file, process=proc)  # fmt: skip


@dataclass(kw_only=True)
class _Pool:
    """One emulator per distinct option set and owner (the session, a module or a test)."""

    directory: Path
    ports: tuple[int, int] = (SEARCH_FROM, SEARCH_TO)
    running: dict[tuple[Any, ...], RunningSupernode] = field(default_factory=dict)
    started: int = 0

    def get(self, options: dict[str, Any], owner: str = "") -> RunningSupernode:
        key = (owner, *sorted(options.items()))
        if key not in self.running:
            self.started += 1
            name = f"{options['preset']}-{options['mode']}-{options['time_scale']:g}"
            self.running[key] = start_supernode(
                directory=self.directory,
                ports=self.ports,
                name=f"{name}-{self.started}" if owner else name,
                **options,
            )
        return self.running[key]

    def release(self, owner: str) -> None:
        """Stop the emulators `owner` (a module's or a test's node id) started."""
        for key in [k for k in self.running if k[0] == owner]:
            self.running.pop(key).stop()

    def close(self) -> None:
        for sn in self.running.values():
            sn.stop()


@pytest.fixture(scope="session")
def _cmemu_pool(request: pytest.FixtureRequest) -> Iterator[_Pool]:
    with tempfile.TemporaryDirectory(prefix="cmemu-pytest-") as directory:
        pool = _Pool(directory=Path(directory), ports=request.config.stash[PORTS_KEY])
        try:
            yield pool
        finally:
            pool.close()


@pytest.fixture(scope="module")
def _cmemu_module(request: pytest.FixtureRequest, _cmemu_pool: _Pool) -> Iterator[str]:
    """The module's owner id: its fresh="module" emulators stop when the module ends."""
    owner = f"module:{request.node.nodeid}"
    try:
        yield owner
    finally:
        _cmemu_pool.release(owner)


def supernode_options(request: pytest.FixtureRequest) -> tuple[dict[str, Any], str]:
    """The emulator a test asks for (the defaults, the ini/command line preset, its marker, an
    indirect parameter) and how long it lives (`fresh`)."""
    options = {**DEFAULTS, "preset": request.config.stash[PRESET_KEY]}
    marker = request.node.get_closest_marker("supernode")
    if marker is not None:
        options.update(marker.kwargs)
    if hasattr(request, "param"):
        options.update(request.param)
    fresh = options.pop("fresh", "session")
    if fresh not in FRESH:
        raise pytest.UsageError(
            f"{request.node.nodeid}: supernode(fresh={fresh!r}): one of {', '.join(FRESH)}"
        )
    return options, str(fresh)


@pytest.fixture
def supernode(
    request: pytest.FixtureRequest, _cmemu_pool: _Pool, _cmemu_module: str
) -> Iterator[RunningSupernode]:
    options, fresh = supernode_options(request)
    if fresh == "session":
        yield _cmemu_pool.get(options)
        return
    owner = _cmemu_module if fresh == "module" else f"test:{request.node.nodeid}"
    running = _cmemu_pool.get(options, owner)
    try:
        yield running
    finally:
        if fresh == "test":
            _cmemu_pool.release(owner)


@dataclass(kw_only=True)
class Chaos:
    """Scenarios and faults against the test's supernode."""

    supernode: RunningSupernode
    injected: list[str] = field(default_factory=list)

    def load(self, scenario: str | Path) -> Scenario:
        return files.load(files.find(str(scenario)))

    def run(
        self,
        scenario: str | Path | Scenario,
        *,
        seed: int | None = None,
        keep: bool = False,
        time_scale: float | None = None,
        warm: bool = False,
    ) -> RunResult:
        """Run a scenario (a file, a library name, or a parsed Scenario) to its verdict;
        `time_scale` paces its steps and traffic (default: the scenario's own, else the
        emulator's), so that a set-up such as a weights load can run faster than the judged part;
        `warm` starts its deployments warm (weights already in EMS: a shorter set-up)."""
        parsed = scenario if isinstance(scenario, Scenario) else self.load(scenario)
        options = RunOptions(seed=seed, keep=keep, time_scale=time_scale, warm=warm)
        return self.supernode.call(lambda c: run_scenario(c, parsed, options))

    def inject(
        self,
        kind: str,
        target: str = "",
        params: dict[str, Any] | None = None,
        *,
        duration_s: float | None = None,
    ) -> ActiveFault:
        """One fault now (cleared after the test unless cleared before)."""
        typed = kinds.checkers()[kind](params or {})
        fault = self.supernode.call(lambda c: kinds.inject(c, kind, target, typed, duration_s))
        self.injected.append(fault.id)
        return fault

    def clear(self, fault_id: str) -> None:
        self.supernode.call(lambda c: kinds.clear(c, fault_id))
        if fault_id in self.injected:
            self.injected.remove(fault_id)

    def clear_all(self) -> None:
        for fault_id in list(self.injected):
            self.clear(fault_id)


@pytest.fixture
def chaos(supernode: RunningSupernode) -> Iterator[Chaos]:
    c = Chaos(supernode=supernode)
    try:
        yield c
    finally:
        c.clear_all()


WaitFor = Callable[..., float]


def _value(result: object) -> object:
    """A condition's result, awaited (on a worker thread's loop) when it is awaitable."""
    if not inspect.isawaitable(result):
        return result
    awaitable = result

    async def resolve() -> object:
        return await awaitable

    return _on_thread(resolve)


@pytest.fixture
def wait_for(supernode: RunningSupernode) -> WaitFor:
    """`wait_for(condition, within_emulated_s)`: the emulated seconds it took; fails the test
    when `condition` has not held by the deadline (in the supernode's emulated time)."""

    def wait(condition: Callable[[], object], within_emulated_s: float) -> float:
        start = supernode.now_s()
        deadline = start + within_emulated_s
        while True:
            value = _value(condition())
            now = supernode.now_s()
            if value:
                return now - start
            if now > deadline:
                pytest.fail(
                    f"condition not met within {within_emulated_s:g} emulated s "
                    f"({now - start:.1f} s passed)"
                )
            time.sleep(POLL_WALL_S)

    return wait
