"""The typed launch API: one call starts a supernode in any mode and stops all of it on exit.

    async with Supernode.start(LaunchOptions(preset="cm384", mode="procs", per="node")) as sn:
        await sn.clients.device("n00-npu0").GetInfo(...)

Every mode consumes one topology document; they differ only in where the servers run:
- inprocess: every server in this process (the embedded default of `cmemu up`);
- procs: the fabric, then one OS process per device or per node, then EMS, each `cmemu serve`
  on its own loopback address, under a supervisor that restarts nothing;
- compose: exactly the services of a compose file, as local processes.
The CLI, the benchmarks and the tests are thin users of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from emulator.client import health
from emulator.client.clients import Clients
from emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    PreconditionError,
    UnknownNameError,
)
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.presets import DEFAULT_PRESET, get_preset
from emulator.model.topology import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    AddressPlan,
    LoopbackPlan,
    PortPlan,
    ServiceKind,
    Topology,
    build,
)
from emulator.runtime import composerun
from emulator.runtime.broker import Broker
from emulator.runtime.events import parse_broker_url
from emulator.runtime.inprocess import InProcessSupernode
from emulator.runtime.procs import ProcSpec, Running, Supervisor
from emulator.runtime.serve import EPOCH_ENV, PER, Per, ServeKind, serve_argv

Mode = Literal["inprocess", "procs", "compose"]
Addressing = Literal["ports", "loopback"]
MODES: tuple[Mode, ...] = ("inprocess", "procs", "compose")
ADDRESSING: tuple[Addressing, ...] = ("ports", "loopback")
EMBEDDED = "embedded"  # broker: an MQTT broker in this process, for this run
NO_BROKER = "none"  # broker: no MQTT at all
EMBEDDED_BROKER_HOST = "127.0.0.1"
CMEMU = str(Path(sys.executable).parent / "cmemu")
PROCS_LOG_LEVEL = "warning"  # a process's own log: its warnings and errors


class StartInterrupted(EmulatorError):
    """The stop event was set while the supernode was still starting; everything is stopped."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How to start a supernode. Every field has the default `cmemu up` has."""

    preset: str = DEFAULT_PRESET
    mode: Mode = "inprocess"
    per: Per = "node"  # procs: one process per node (or per device)
    time_scale: float = 1.0  # emulated seconds per wall second
    addressing: Addressing | None = None  # default: ports in process, loopback for procs
    host: str = DEFAULT_HOST  # ports: the address every server binds
    base_port: int = DEFAULT_BASE_PORT  # ports: the first server's port; the others follow
    port: int = CONTAINER_PORT  # loopback: every server's port
    first_octet: int = 10  # loopback: 127.<first_octet>.x.y upwards
    compose_file: Path | None = None  # compose: the file whose services run
    broker: str = EMBEDDED  # EMBEDDED, NO_BROKER, or mqtt://HOST:PORT
    run_dir: Path | None = None  # procs, compose: logs and files; default a temporary directory
    drain_s: float = 0.2  # between NOT_SERVING and stop
    ready_timeout_s: float = 180.0  # for every server to answer SERVING
    profile: HardwareProfile = field(default=DEFAULT_PROFILE, repr=False)

    def __post_init__(self) -> None:
        checks: list[tuple[str, object, tuple[str, ...]]] = [
            ("mode", self.mode, MODES),
            ("per", self.per, PER),
        ]
        if self.addressing is not None:
            checks.append(("addressing", self.addressing, ADDRESSING))
        for what, value, known in checks:
            if value not in known:
                raise UnknownNameError(what, str(value), known)
        if not self.time_scale > 0:
            raise InvalidArgumentError(f"time_scale must be > 0, got {self.time_scale}")
        if (self.mode == "compose") != (self.compose_file is not None):
            raise InvalidArgumentError("a compose file goes with mode 'compose', and only with it")
        if self.broker not in (EMBEDDED, NO_BROKER):
            parse_broker_url(self.broker)
        if self.mode != "compose":
            get_preset(self.preset)

    @property
    def plan(self) -> AddressPlan:
        """Process mode gives each device an address of its own, as a container has."""
        addressing = self.addressing or ("loopback" if self.mode == "procs" else "ports")
        if addressing == "loopback":
            return LoopbackPlan(port=self.port, first_octet=self.first_octet)
        return PortPlan(host=self.host, base_port=self.base_port)

    def topology(self) -> Topology:
        """The topology document of the preset with these addresses (not for compose, whose
        file carries its own)."""
        return build(self.preset, plan=self.plan, time_scale=self.time_scale, profile=self.profile)


@dataclass(kw_only=True)
class Supernode:
    """A running supernode: its topology (with live addresses, epoch and broker), typed clients,
    and for the in-process mode the servers themselves (`local`)."""

    options: LaunchOptions
    topology: Topology
    clients: Clients
    inprocess: InProcessSupernode | None = None
    supervisor: Supervisor | None = None
    run_dir: Path | None = None

    @property
    def mode(self) -> str:
        """What `cmemu status` shows: the mode and its flavour."""
        o = self.options
        return {
            "inprocess": "inprocess",
            "procs": f"procs per {o.per}",
            "compose": f"compose {o.compose_file}",
        }[o.mode]

    @property
    def local(self) -> InProcessSupernode:
        """The servers themselves (their state), when they run in this process."""
        if self.inprocess is None:
            raise PreconditionError(f"the servers run in other processes ({self.mode})")
        return self.inprocess

    @property
    def broker(self) -> str | None:
        return self.topology.broker

    @property
    def died(self) -> list[Running]:
        """Processes that exited on their own (procs and compose modes)."""
        return list(self.supervisor.died) if self.supervisor is not None else []

    def address(self, server_id: str) -> str:
        """The address of a device or of a supernode-wide service."""
        for service in self.topology.services:
            if service.id == server_id:
                return service.address
        return self.topology.device(server_id).address

    @staticmethod
    def start(
        options: LaunchOptions,
        *,
        stop: asyncio.Event | None = None,
        on_death: Callable[[Running], None] | None = None,
    ) -> AbstractAsyncContextManager[Supernode]:
        """Start the supernode; the context yields once every server answers SERVING over gRPC
        and stops everything on exit. `stop`, set while starting, aborts the start
        (StartInterrupted); `on_death` hears of every process that exits on its own."""
        return _start(options, stop=stop or asyncio.Event(), on_death=on_death)


@contextlib.asynccontextmanager
async def _start(
    options: LaunchOptions,
    *,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    async with contextlib.AsyncExitStack() as stack:
        sn = await stack.enter_async_context(LAUNCHERS[options.mode](options, stop, on_death))
        stack.push_async_callback(sn.clients.close)
        yield sn


# --- the broker -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _broker(options: LaunchOptions, topology: Topology) -> AsyncIterator[Topology]:
    """The topology with its broker: the one given, none, or an embedded one for the run."""
    if options.broker == NO_BROKER:
        yield topology
    elif options.broker != EMBEDDED:
        yield dataclasses.replace(topology, broker=options.broker)
    else:
        async with Broker(host=EMBEDDED_BROKER_HOST) as broker:
            yield dataclasses.replace(topology, broker=broker.url)


# --- in process -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _inprocess(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    topology = await asyncio.to_thread(options.topology)
    async with (
        _broker(options, topology) as with_broker,
        # EMS's SSD tier lives as long as this process: its DRAM copies die with it anyway
        InProcessSupernode(with_broker, profile=options.profile, drain_s=options.drain_s) as local,
    ):
        yield Supernode(
            options=options,
            topology=local.topology,
            clients=Clients(local.topology),
            inprocess=local,
        )


# --- processes ------------------------------------------------------------------------------

# When each supernode-wide service starts, relative to the devices: the fabric first (devices
# hand it their first transaction as soon as they serve), EMS after them (it rebuilds its index
# from the memory pools). Wave 1 is the devices.
SERVICE_WAVE: dict[ServiceKind, int] = {ServiceKind.FABRIC: 0, ServiceKind.EMS: 2}


def proc_waves(topology: Topology, topology_path: Path, per: Per) -> list[list[ProcSpec]]:
    """The processes of `--mode procs`, in the waves they start in."""

    def spec(kind: ServeKind, name: str, addresses: tuple[str, ...]) -> ProcSpec:
        argv = serve_argv(
            CMEMU,
            str(topology_path),
            kind,
            name,
            ems_ssd_dir=str(topology_path.parent / "ems-ssd"),
            log_level=PROCS_LOG_LEVEL,
        )
        return ProcSpec(name=name, argv=tuple(argv), addresses=addresses)

    waves: list[list[ProcSpec]] = [[], [], []]
    for service in topology.services:
        waves[SERVICE_WAVE[service.kind]].append(spec("service", service.id, (service.address,)))
    if per == "device":
        waves[1] = [spec("device", d.id, (d.address,)) for d in topology.devices]
    else:
        waves[1] = [
            spec("node", node, tuple(d.address for d in topology.in_node(node)))
            for node in topology.nodes
        ]
    return waves


async def _make_run_dir(options: LaunchOptions) -> Path:
    if options.run_dir is None:
        return Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="cmemu-run-"))
    await asyncio.to_thread(options.run_dir.mkdir, parents=True, exist_ok=True)
    return options.run_dir


@contextlib.asynccontextmanager
async def _supervised(
    options: LaunchOptions,
    waves: list[list[ProcSpec]],
    *,
    topology: Topology,
    run_dir: Path,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    """Start the waves one after another, each once the previous one answers SERVING. The run
    directory is removed at the end unless a process died: its log explains the death."""
    supervisor = Supervisor(log_dir=run_dir / "logs", on_exit=on_death)
    try:
        async with supervisor:

            def still_starting() -> None:
                supervisor.check_alive()
                if stop.is_set():
                    raise StartInterrupted("stopped while starting")

            for wave in waves:
                await supervisor.start(wave)
                await health.wait_serving(
                    [a for spec in wave for a in spec.addresses],
                    timeout_s=options.ready_timeout_s,
                    still_starting=still_starting,
                )
            yield Supernode(
                options=options,
                topology=topology,
                clients=Clients(topology),
                supervisor=supervisor,
                run_dir=run_dir,
            )
    finally:
        if not supervisor.died:
            await asyncio.to_thread(shutil.rmtree, run_dir, True)


@contextlib.asynccontextmanager
async def _procs(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    run_dir = await _make_run_dir(options)
    topology = await asyncio.to_thread(options.topology)
    # every process computes the same emulated time from the same epoch
    topology = dataclasses.replace(topology, epoch_wall_s=time.time())
    async with _broker(options, topology) as with_broker:
        topology_path = run_dir / "topology.json"
        await asyncio.to_thread(topology_path.write_text, with_broker.to_json())
        waves = proc_waves(with_broker, topology_path, options.per)
        async with _supervised(
            options, waves, topology=with_broker, run_dir=run_dir, stop=stop, on_death=on_death
        ) as sn:
            yield sn


@contextlib.asynccontextmanager
async def _compose(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    assert options.compose_file is not None
    run_dir = await _make_run_dir(options)
    env = {**os.environ, EPOCH_ENV: os.environ.get(EPOCH_ENV) or repr(time.time())}
    services, topology = await asyncio.to_thread(
        composerun.load, options.compose_file, env, run_dir
    )
    waves = [[s.spec for s in wave] for wave in composerun.start_order(services)]
    async with _supervised(
        options, waves, topology=topology, run_dir=run_dir, stop=stop, on_death=on_death
    ) as sn:
        yield sn


Launcher = Callable[
    [LaunchOptions, asyncio.Event, Callable[[Running], None] | None],
    AbstractAsyncContextManager[Supernode],
]
LAUNCHERS: dict[Mode, Launcher] = {"inprocess": _inprocess, "procs": _procs, "compose": _compose}
