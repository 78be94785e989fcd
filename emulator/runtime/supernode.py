"""The typed launch API: one call starts a supernode in any mode and stops all of it on exit.

    async with Supernode.start(LaunchOptions(preset="cm384", mode="procs", per="node")) as sn:
        await sn.clients.device("n00-npu0").GetInfo(...)

Every mode consumes one topology document; they differ only in where the servers run:
- inprocess: every server in this process (the embedded default of `cmemu up`);
- procs: the fabric, then one OS process per device or per node, then EMS, each `cmemu serve`
  on its own loopback address, under a supervisor that restarts nothing;
- compose: exactly the services of a compose file, as local processes;
- k8s: exactly the containers of Kubernetes manifests (`cmemu k8s`), as local processes.
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
from emulator.client.clock import followed_time
from emulator.client.credentials import ANONYMOUS, Credentials
from emulator.engines.clock import TimeKeeper
from emulator.model.clock import Clock
from emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    PreconditionError,
    UnknownNameError,
    bind_error,
)
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.presets import DEFAULT_PRESET, get_preset
from emulator.model.scaleout import build_cluster
from emulator.model.tenants import Keys
from emulator.model.topology import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    AddressPlan,
    LoopbackPlan,
    PortPlan,
    ServiceKind,
    Topology,
)
from emulator.runtime import composerun, k8srun, tls
from emulator.runtime.broker import Broker
from emulator.runtime.composeengine import ENGINE_FIRST_OCTET
from emulator.runtime.deaths import death_reporter
from emulator.runtime.docker import DockerEngine
from emulator.runtime.events import parse_broker_url
from emulator.runtime.image import IMAGE
from emulator.runtime.inprocess import InProcessSupernode
from emulator.runtime.procs import ProcSpec, Running, Supervisor
from emulator.runtime.registry import DEVICE_WAVE, SERVICE_SPECS, WAVES
from emulator.runtime.security import MQTT_USER, Security
from emulator.runtime.security import NONE as NO_SECURITY
from emulator.runtime.serve import PER, Per, ServeKind, clock_from_fabric, serve_argv
from emulator.runtime.tls import TlsFiles

Mode = Literal["inprocess", "procs", "compose", "k8s", "docker"]
Progress = Callable[[str, int, int], None]
Addressing = Literal["ports", "loopback"]
MODES: tuple[Mode, ...] = ("inprocess", "procs", "compose", "k8s", "docker")
ADDRESSING: tuple[Addressing, ...] = ("ports", "loopback")
EMBEDDED = "embedded"  # broker: an MQTT broker in this process, for this run
NO_BROKER = "none"  # broker: no MQTT at all
EMBEDDED_BROKER_HOST = "127.0.0.1"
CMEMU = str(Path(sys.executable).parent / "cmemu")
PROCS_LOG_LEVEL = "warning"  # a process's own log: its warnings and errors
FABRIC_CLOCK_WAIT_S = 10.0  # it answers SERVING by then: its clock answers at once


class StartInterrupted(EmulatorError):
    """The stop event was set while the supernode was still starting; everything is stopped."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How to start a supernode. Every field has the default `cmemu up` has."""

    preset: str = DEFAULT_PRESET
    mode: Mode = "inprocess"
    per: Per = "node"  # procs: one process per node (or per device)
    time_scale: float = 1.0  # emulated seconds per wall second: a ceiling (see dilation)
    # emulated time slows when the emulator cannot keep up (emulator/engines/clock.py); off,
    # it is wall time x time_scale, and a busy host shows as late replies and missed beats
    dilation: bool = True
    addressing: Addressing | None = None  # default: ports in process, loopback for procs
    host: str = DEFAULT_HOST  # ports: the address every server binds
    base_port: int = DEFAULT_BASE_PORT  # ports: the first server's port; the others follow
    port: int = CONTAINER_PORT  # loopback: every server's port
    first_octet: int = 10  # loopback: 127.<first_octet>.x.y upwards
    compose_file: Path | None = None  # compose, docker: the file whose services run
    image: str = IMAGE  # docker: the emulator's image (`cmemu image build`)
    project: str | None = None  # docker: the compose project (default cmemu-<pid>)
    engine_octet: int = ENGINE_FIRST_OCTET  # docker: containers published on 127.<this>.x.y
    k8s_dir: Path | None = None  # k8s: the directory of manifests whose containers run
    broker: str = EMBEDDED  # EMBEDDED, NO_BROKER, or mqtt://HOST:PORT
    # EMBEDDED: where it listens, HOST:PORT (`cmemu up`: in the instance's block, ports.py);
    # None: a free port of 127.0.0.1
    broker_address: str | None = None
    run_dir: Path | None = None  # procs, compose: logs and files; default a temporary directory
    drain_s: float = 0.2  # between NOT_SERVING and stop
    ready_timeout_s: float = 180.0  # for every server to answer SERVING
    profile: HardwareProfile = field(default=DEFAULT_PROFILE, repr=False)
    # who may change state (DESIGN principle 11): see emulator/runtime/security.py
    token: str | None = field(default=None, repr=False)  # guards every state-changing RPC
    keys: Keys | None = field(default=None, repr=False)  # a keys file: the endpoint's tenants
    insecure: bool = False  # accept binding beyond loopback without a token
    tls: TlsFiles | Literal["auto"] | None = None  # "auto": a CA and certificate for this run
    tls_dir: Path | None = None  # tls "auto": where they go (default a temporary directory)
    metrics: bool = True  # every process serves /metrics (emulator/runtime/metrics.py)
    # hears how far the start is: (what it is doing, servers SERVING, servers in all); for a
    # progress bar (`cmemu up` on a terminal). Called on the event loop, so it must not block.
    progress: Progress | None = field(default=None, repr=False, compare=False)

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
        if (self.mode == "compose") > (self.compose_file is not None) or (
            self.compose_file is not None and self.mode not in ("compose", "docker")
        ):
            raise InvalidArgumentError(
                "a compose file goes with mode 'compose' (or 'docker'), and only with them"
            )
        if self.broker not in (EMBEDDED, NO_BROKER):
            parse_broker_url(self.broker)
        if (self.mode == "k8s") != (self.k8s_dir is not None):
            raise InvalidArgumentError(
                "a manifest directory goes with mode 'k8s', and only with it"
            )
        if self.mode not in ("compose", "k8s") and not (
            self.mode == "docker" and self.compose_file
        ):
            get_preset(self.preset)

    @property
    def plan(self) -> AddressPlan:
        """Process mode gives each device an address of its own, as a container has."""
        addressing = self.addressing or ("loopback" if self.mode == "procs" else "ports")
        if addressing == "loopback":
            return LoopbackPlan(port=self.port, first_octet=self.first_octet)
        return PortPlan(host=self.host, base_port=self.base_port)

    def supernodes(self) -> tuple[Topology, ...]:
        """The topology documents of the preset's supernodes (one unless it is `<base>x<N>`)
        with these addresses (not for compose, whose file carries its own)."""
        supernodes = build_cluster(
            self.preset, plan=self.plan, time_scale=self.time_scale, profile=self.profile
        )
        if not self.dilation:
            supernodes = tuple(dataclasses.replace(t, dilation=False) for t in supernodes)
        limit = self.profile.limits.live_supernodes_max
        if len(supernodes) > limit:
            raise InvalidArgumentError(
                f"preset {self.preset}: {len(supernodes)} supernodes; the live launchers start "
                f"at most {limit} (model mode takes up to "
                f"{self.profile.scaleout.max_supernodes}: `cmemu simulate scaleout`)"
            )
        # ports: one host has room for one /metrics, the in-process supernode's
        one_process = self.mode == "inprocess" or not isinstance(self.plan, PortPlan)
        if self.metrics and one_process:
            return supernodes
        return tuple(dataclasses.replace(t, metrics_port=None) for t in supernodes)

    def topology(self) -> Topology:
        """The first supernode's document (the only one, but for a `<base>x<N>` preset)."""
        return self.supernodes()[0]


@dataclass(kw_only=True)
class Supernode:
    """A running supernode: its topology (with live addresses, epoch and broker), typed clients,
    and for the in-process mode the servers themselves (`local`)."""

    options: LaunchOptions
    topology: Topology  # the first supernode's (the only one, but for `<base>x<N>`)
    clients: Clients
    inprocess: InProcessSupernode | None = None
    supervisor: Supervisor | None = None
    supernodes: tuple[Topology, ...] = ()  # every supernode's document (default: topology)
    inprocesses: tuple[InProcessSupernode, ...] = ()  # in process: every supernode's servers
    run_dir: Path | None = None
    security: Security = NO_SECURITY  # the token and TLS files the servers run with
    # emulated time as this process reads it: the owner's in process, else followed
    time: TimeKeeper | None = None
    engine: DockerEngine | None = None  # docker mode: the containers, for container faults

    def __post_init__(self) -> None:
        self.supernodes = self.supernodes or (self.topology,)
        if self.inprocess is not None:
            self.inprocesses = self.inprocesses or (self.inprocess,)

    async def not_serving(self) -> None:
        """Turn every server this process hosts NOT_SERVING now (a stop's first step; the
        processes of procs and compose mode do it themselves on SIGTERM)."""
        await asyncio.gather(*(local.not_serving() for local in self.inprocesses))

    def local_of(self, supernode: int) -> InProcessSupernode:
        """Supernode `supernode`'s servers, when they run in this process."""
        if not self.inprocesses:
            raise PreconditionError(f"the servers run in other processes ({self.mode})")
        return self.inprocesses[supernode]

    @property
    def credentials(self) -> Credentials:
        """What a client of this supernode presents: the token and the CA."""
        return self.clients.credentials

    @property
    def mode(self) -> str:
        """What `cmemu status` shows: the mode and its flavour."""
        o = self.options
        return {
            "inprocess": "inprocess",
            "procs": f"procs per {o.per}",
            "compose": f"compose {o.compose_file}",
            "k8s": f"k8s {o.k8s_dir}",
            "docker": f"docker {o.compose_file or f'{o.preset} per {o.per}'}",
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
        """The address of a device or of a supernode-wide service, of any supernode."""
        for topology in self.supernodes:
            for service in topology.services:
                if service.id == server_id:
                    return service.address
        return self.clients.find(server_id).address

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
        if stop.is_set():  # while starting (in process, a start runs to its end first)
            raise StartInterrupted("stopped while starting")
        stack.push_async_callback(sn.clients.close)
        yield sn


# --- the broker -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _broker(
    options: LaunchOptions, topology: Topology, security: Security
) -> AsyncIterator[Topology]:
    """The topology with its broker: the one given, none, or an embedded one for the run,
    which wants the run's login (`security.mqtt_login()`) when it has one."""
    if options.broker == NO_BROKER:
        yield topology
    elif options.broker != EMBEDDED:
        yield dataclasses.replace(topology, broker=options.broker)
    else:
        host, port = EMBEDDED_BROKER_HOST, 0
        if options.broker_address is not None:
            host, _, at = options.broker_address.rpartition(":")
            port = int(at)
        try:
            embedded = Broker(host=host, port=port, login=security.mqtt_login())
            await embedded.__aenter__()
        except OSError as exc:
            raise bind_error("the embedded broker", f"{host}:{port}", exc) from exc
        try:
            yield dataclasses.replace(topology, broker=embedded.url)
        finally:
            await embedded.__aexit__(None, None, None)


# --- in process -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _inprocess(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    """Every supernode of the preset in this process, one InProcessSupernode each, sharing
    the broker, the token and emulated time (one epoch: the scale-out plane times flows between
    them)."""
    supernodes = await asyncio.to_thread(options.supernodes)
    epoch = time.time()
    supernodes = tuple(dataclasses.replace(t, epoch_wall_s=epoch) for t in supernodes)
    total = sum(len(_servers(t)) for t in supernodes)
    report(options, f"starting {total} servers in process", 0, total)
    # one emulated time for every supernode of this process, owned here
    clock = Clock(time_scale=options.time_scale, epoch_wall_s=epoch)
    profile = dataclasses.replace(options.profile.clock, dilation=options.dilation)
    keeper = TimeKeeper(clock, profile=profile, process="inprocess", owner=True)
    async with contextlib.AsyncExitStack() as stack:
        running = asyncio.ensure_future(keeper.run())
        stack.callback(keeper.close)
        stack.push_async_callback(_cancelled, running)
        security = await stack.enter_async_context(_security(options, *supernodes))
        first = await stack.enter_async_context(_broker(options, supernodes[0], security))
        started: list[InProcessSupernode] = []
        for topology in supernodes:  # one broker for them all
            with_broker = dataclasses.replace(topology, broker=first.broker)
            # EMS's SSD tier lives as long as this process: its DRAM copies die with it anyway
            local = await stack.enter_async_context(
                InProcessSupernode(
                    with_broker,
                    profile=options.profile,
                    drain_s=options.drain_s,
                    security=security,
                    time=keeper,
                )
            )
            started.append(local)
        docs = tuple(x.topology for x in started)
        yield Supernode(
            options=options,
            topology=docs[0],
            clients=Clients(docs[0], security.credentials(), supernodes=docs),
            inprocess=started[0],
            inprocesses=tuple(started),
            supernodes=docs,
            security=security,
            time=keeper,
        )


async def _cancelled(task: asyncio.Future[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def report(options: LaunchOptions, what: str, done: int, total: int) -> None:
    if options.progress is not None:
        options.progress(what, done, total)


def _servers(topology: Topology) -> list[tuple[str, str]]:
    """(id, address) of every server of a topology."""
    return [(d.id, d.address) for d in topology.devices] + [
        (x.id, x.address) for x in topology.services
    ]


@contextlib.asynccontextmanager
async def _security(
    options: LaunchOptions, *supernodes: Topology, token: str | None = None
) -> AsyncIterator[Security]:
    """The run's token and TLS files. Binding beyond loopback without a token fails here,
    before anything starts; `tls="auto"` makes a CA and a certificate naming every address
    (removed at the end when in a temporary directory). With a token, the embedded broker
    wants user MQTT_USER with the token as its password, and every client of it logs in."""
    servers = [server for topology in supernodes for server in _servers(topology)]
    token = token or options.token
    keys = options.keys if options.keys is not None and options.keys.admin == token else None
    guard = Security(token=token, insecure=options.insecure).server()
    for server_id, address in servers:
        guard.check_bind(server_id, address)
    # a broker of the user's own is not given the token: it may not be ours to trust
    mqtt_user = MQTT_USER if token and options.broker == EMBEDDED else None
    if options.tls != "auto":
        yield Security(
            token=token, keys=keys, tls=options.tls, insecure=options.insecure, mqtt_user=mqtt_user
        )
        return
    with contextlib.ExitStack() as stack:
        directory = options.tls_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="cmemu-tls-"))
        )
        files = await asyncio.to_thread(
            tls.make_auto, directory, tls.hosts_of(a for _, a in servers)
        )
        yield Security(
            token=token, keys=keys, tls=files, insecure=options.insecure, mqtt_user=mqtt_user
        )


# --- processes ------------------------------------------------------------------------------


def proc_waves(topology: Topology, topology_path: Path, per: Per) -> list[list[ProcSpec]]:
    """The processes of `--mode procs`, in the waves they start in."""
    ssd = "ems-ssd" if topology.index == 0 else f"ems-ssd-{topology.supernode}"

    def spec(
        kind: ServeKind, name: str, addresses: tuple[str, ...], servers: tuple[str, ...]
    ) -> ProcSpec:
        argv = serve_argv(
            CMEMU,
            str(topology_path),
            kind,
            name,
            ems_ssd_dir=str(topology_path.parent / ssd),
            log_level=PROCS_LOG_LEVEL,
        )
        return ProcSpec(name=name, argv=tuple(argv), addresses=addresses, servers=servers)

    waves: list[list[ProcSpec]] = [[] for _ in range(WAVES)]
    for service in topology.services:
        waves[SERVICE_SPECS[service.kind].wave].append(
            spec("service", service.id, (service.address,), (service.id,))
        )
    if per == "device":
        waves[DEVICE_WAVE] = [spec("device", d.id, (d.address,), (d.id,)) for d in topology.devices]
    else:
        waves[DEVICE_WAVE] = [
            spec(
                "node",
                node,
                tuple(d.address for d in topology.in_node(node)),
                tuple(d.id for d in topology.in_node(node)),
            )
            for node in topology.nodes
        ]
    return waves


async def make_run_dir(options: LaunchOptions) -> Path:
    if options.run_dir is None:
        return Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="cmemu-run-"))
    await asyncio.to_thread(options.run_dir.mkdir, parents=True, exist_ok=True)
    return options.run_dir


def wave_addresses(wave: list[ProcSpec]) -> list[str]:
    return [a for spec in wave for a in spec.addresses]


async def _with_fabric_clock(topology: Topology, credentials: Credentials = ANONYMOUS) -> Topology:
    clients = Clients(topology, credentials)
    try:
        clock = await clock_from_fabric(clients, FABRIC_CLOCK_WAIT_S)
    finally:
        await clients.close()
    return dataclasses.replace(topology, epoch_wall_s=clock.epoch_wall_s)


@contextlib.asynccontextmanager
async def _supervised(
    options: LaunchOptions,
    waves: list[list[ProcSpec]],
    *,
    supernodes: tuple[Topology, ...],
    run_dir: Path,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
    security: Security = NO_SECURITY,
) -> AsyncIterator[Supernode]:
    """Start the waves one after another, each once the previous one answers SERVING. A process
    that dies is a `died` event for each of its servers. The run directory is removed at the end
    unless a process died: its log explains the death."""
    topology = supernodes[0]
    fabric = topology.service(ServiceKind.FABRIC).address
    credentials = security.credentials()
    async with death_reporter(supernodes, on_death, login=security.mqtt_login()) as reporter:
        supervisor = Supervisor(log_dir=run_dir / "logs", on_exit=reporter)
        keeper: TimeKeeper | None = None
        try:
            async with supervisor, contextlib.AsyncExitStack() as stack:

                def still_starting() -> None:
                    supervisor.check_alive()
                    if stop.is_set():
                        raise StartInterrupted("stopped while starting")

                total, done = sum(len(wave_addresses(w)) for w in waves), 0
                for number, wave in enumerate(waves, 1):
                    report(
                        options, f"starting processes, wave {number} of {len(waves)}", done, total
                    )
                    await supervisor.start(wave)
                    await health.wait_serving(
                        wave_addresses(wave),
                        timeout_s=options.ready_timeout_s,
                        still_starting=still_starting,
                        credentials=credentials,
                    )
                    if fabric in wave_addresses(wave):
                        if topology.epoch_wall_s is None:
                            # compose without $CMEMU_EPOCH: sn0's fabric took the epoch when it
                            # started (and gave it to the other supernodes' fabrics)
                            topology = reporter.topology = await _with_fabric_clock(
                                topology, credentials
                            )
                            supernodes = tuple(
                                dataclasses.replace(t, epoch_wall_s=topology.epoch_wall_s)
                                for t in supernodes
                            )
                        keeper = await stack.enter_async_context(
                            followed_time(topology, credentials, name="launcher", report=False)
                        )
                        reporter.now_ns = keeper.timeline.now_ns
                    done += len(wave_addresses(wave))
                yield Supernode(
                    options=options,
                    topology=supernodes[0],
                    clients=Clients(supernodes[0], credentials, supernodes=supernodes),
                    supernodes=supernodes,
                    supervisor=supervisor,
                    run_dir=run_dir,
                    security=security,
                    time=keeper,
                )
        finally:
            if not supervisor.died:
                await asyncio.to_thread(shutil.rmtree, run_dir, True)


def topology_file(run_dir: Path, topology: Topology) -> Path:
    """Where a supernode's document goes in a run directory (topology.json for sn0)."""
    index = topology.index
    return run_dir / ("topology.json" if index == 0 else f"topology-{topology.supernode}.json")


def merge_waves(per_supernode: list[list[list[ProcSpec]]]) -> list[list[ProcSpec]]:
    """Several supernodes start wave by wave together: every fabric, then every device..."""
    return [[spec for waves in per_supernode for spec in waves[w]] for w in range(WAVES)]


@contextlib.asynccontextmanager
async def _procs(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    run_dir = await make_run_dir(options)
    supernodes = await asyncio.to_thread(options.supernodes)
    # every process computes the same emulated time from the same epoch
    epoch = time.time()
    supernodes = tuple(dataclasses.replace(t, epoch_wall_s=epoch) for t in supernodes)
    async with (
        _security(options, *supernodes) as security,
        _broker(options, supernodes[0], security) as first,
    ):
        docs = tuple(dataclasses.replace(t, broker=first.broker) for t in supernodes)
        per_supernode = []
        for doc in docs:
            path = topology_file(run_dir, doc)
            await asyncio.to_thread(path.write_text, doc.to_json())
            per_supernode.append(proc_waves(doc, path, options.per))
        env = await asyncio.to_thread(security.env, run_dir)
        waves = [
            [dataclasses.replace(spec, env={**spec.env, **env}) for spec in wave]
            for wave in merge_waves(per_supernode)
        ]
        async with _supervised(
            options,
            waves,
            supernodes=docs,
            run_dir=run_dir,
            stop=stop,
            on_death=on_death,
            security=security,
        ) as sn:
            yield sn


@dataclass(frozen=True, kw_only=True)
class _Loaded:
    """What a compose file or a directory of manifests runs: its processes in start waves, the
    supernodes they serve, and the token the files give them (None: the options')."""

    waves: list[list[ProcSpec]]
    supernodes: tuple[Topology, ...]
    token: str | None


def _broker_override(options: LaunchOptions) -> str | None:
    """The files' own broker, unless the options name one (or none)."""
    return None if options.broker == EMBEDDED else options.broker


def _load_compose(options: LaunchOptions, run_dir: Path) -> _Loaded:
    # as `docker compose up` does: the fabric's epoch, unless $CMEMU_EPOCH gives one to all
    assert options.compose_file is not None
    services, supernodes = composerun.load(
        options.compose_file, dict(os.environ), run_dir, broker=_broker_override(options)
    )
    return _Loaded(
        waves=[[s.spec for s in wave] for wave in composerun.start_order(services)],
        supernodes=supernodes,
        token=composerun.token_of(services),
    )


def _load_k8s(options: LaunchOptions, run_dir: Path) -> _Loaded:
    assert options.k8s_dir is not None
    run = k8srun.load(options.k8s_dir, run_dir, broker=_broker_override(options))
    return _Loaded(waves=run.waves, supernodes=run.supernodes, token=run.token)


def _from_files(
    load: Callable[[LaunchOptions, Path], _Loaded],
) -> Launcher:
    """A launcher of the processes that files describe (a compose file, Kubernetes manifests),
    wave by wave, under the supervisor."""

    @contextlib.asynccontextmanager
    async def launch(
        options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
    ) -> AsyncIterator[Supernode]:
        run_dir = await make_run_dir(options)
        try:
            loaded = await asyncio.to_thread(load, options, run_dir)
        except BaseException:  # nothing ran: nothing to keep
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
            raise
        # the files' own token (a secret) wins; else the options' is given to every process
        async with _security(options, *loaded.supernodes, token=loaded.token) as security:
            env = await asyncio.to_thread(security.env, run_dir)
            waves = [
                [dataclasses.replace(spec, env={**env, **spec.env}) for spec in wave]
                for wave in loaded.waves
            ]
            async with _supervised(
                options,
                waves,
                supernodes=loaded.supernodes,
                run_dir=run_dir,
                stop=stop,
                on_death=on_death,
                security=security,
            ) as sn:
                yield sn

    return launch


@contextlib.asynccontextmanager
async def _docker(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> AsyncIterator[Supernode]:
    """Compose through the Docker engine (emulator/runtime/enginelaunch.py, which builds on
    this module)."""
    from emulator.runtime import enginelaunch

    async with enginelaunch.launch(options, stop, on_death) as sn:
        yield sn


Launcher = Callable[
    [LaunchOptions, asyncio.Event, Callable[[Running], None] | None],
    AbstractAsyncContextManager[Supernode],
]
LAUNCHERS: dict[Mode, Launcher] = {
    "inprocess": _inprocess,
    "procs": _procs,
    "compose": _from_files(_load_compose),
    "k8s": _from_files(_load_k8s),
    "docker": _docker,
}
