"""The launchers of processes: `--mode procs` (the fabric, then one OS process per device or
per node, then EMS, each `cmemu serve` on its own loopback address) and the processes that files
describe (a compose file, Kubernetes manifests), each started wave by wave under the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cmemu.emulator.client import health
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.clock import followed_time
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime.deaths import death_reporter
from cmemu.emulator.runtime.forked import ForkOptions, fork_wanted
from cmemu.emulator.runtime.launchoptions import (
    CMEMU,
    EMBEDDED,
    Compose,
    K8s,
    LaunchOptions,
    Procs,
    StartInterrupted,
    report,
)
from cmemu.emulator.runtime.launchsetup import broker_for, make_run_dir, security_for
from cmemu.emulator.runtime.procs import ProcSpec, Running, Supervisor
from cmemu.emulator.runtime.registry import DEVICE_WAVE, SERVICE_SPECS, WAVES
from cmemu.emulator.runtime.security import NONE as NO_SECURITY
from cmemu.emulator.runtime.security import Security
from cmemu.emulator.runtime.serve import (
    BROKER_ENV,
    Per,
    ServeKind,
    clock_from_fabric,
    serve_argv,
)
from cmemu.emulator.runtime.supernode import Launcher, Supernode

PROCS_LOG_LEVEL = "warning"  # a process's own log: its warnings and errors
# what a serve process imports once it has a broker to publish to (emulator/runtime/events.py)
EVENT_MODULES = ("aiomqtt", "encodings.idna")  # idna: its first connect encodes the host
FABRIC_CLOCK_WAIT_S = 10.0  # it answers SERVING by then: its clock answers at once


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
async def supervised(
    options: LaunchOptions,
    waves: list[list[ProcSpec]],
    *,
    supernodes: tuple[Topology, ...],
    run_dir: Path,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
    security: Security = NO_SECURITY,
    fork: ForkOptions | None = None,
) -> AsyncIterator[Supernode]:
    """Start the waves one after another, each once the previous one answers SERVING. A process
    that dies is a `died` event for each of its servers. The run directory is removed at the end
    unless a process died: its log explains the death. `fork`: started by a fork server."""
    topology = supernodes[0]
    fabric = topology.service(ServiceKind.FABRIC).address
    credentials = security.credentials()
    async with death_reporter(supernodes, on_death, login=security.mqtt_login()) as reporter:
        supervisor = Supervisor(log_dir=run_dir / "logs", on_exit=reporter, fork=fork)
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
async def launch_procs(
    options: LaunchOptions,
    mode: Procs,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    run_dir = await make_run_dir(mode.run_dir)
    supernodes = await asyncio.to_thread(options.supernodes)
    # every process computes the same emulated time from the same epoch
    epoch = time.time()
    supernodes = tuple(dataclasses.replace(t, epoch_wall_s=epoch) for t in supernodes)
    async with (
        security_for(options, *supernodes) as security,
        broker_for(options, supernodes[0], security) as first,
    ):
        docs = tuple(dataclasses.replace(t, broker=first.broker) for t in supernodes)
        per_supernode = []
        for doc in docs:
            path = topology_file(run_dir, doc)
            await asyncio.to_thread(path.write_text, doc.to_json())
            per_supernode.append(proc_waves(doc, path, mode.per))
        env = await asyncio.to_thread(security.env, run_dir)
        waves = [
            [dataclasses.replace(spec, env={**spec.env, **env}) for spec in wave]
            for wave in merge_waves(per_supernode)
        ]
        # forked from one process that imported the serve path once (issue 18), unless
        # $CMEMU_FORK=0
        fork = _fork_options(broker=bool(first.broker))
        async with supervised(
            options,
            waves,
            supernodes=docs,
            run_dir=run_dir,
            stop=stop,
            on_death=on_death,
            security=security,
            fork=fork,
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


def _load_compose(options: LaunchOptions, mode: Compose, run_dir: Path) -> _Loaded:
    # imported here: they read YAML (PyYAML), which nothing else a launch runs needs (issue 18)
    from cmemu.emulator.runtime import composerun

    # as `docker compose up` does: the fabric's epoch, unless $CMEMU_EPOCH gives one to all
    services, supernodes = composerun.load(
        mode.file, dict(os.environ), run_dir, broker=_broker_override(options)
    )
    return _Loaded(
        waves=[[s.spec for s in wave] for wave in composerun.start_order(services)],
        supernodes=supernodes,
        token=composerun.token_of(services),
    )


def _load_k8s(options: LaunchOptions, mode: K8s, run_dir: Path) -> _Loaded:
    from cmemu.emulator.runtime import k8srun  # as composerun above

    run = k8srun.load(mode.manifests, run_dir, broker=_broker_override(options))
    return _Loaded(waves=run.waves, supernodes=run.supernodes, token=run.token)


FileMode = TypeVar("FileMode", Compose, K8s)


def _from_files(
    load: Callable[[LaunchOptions, FileMode, Path], _Loaded],
) -> Launcher[FileMode]:
    """A launcher of the processes that files describe (a compose file, Kubernetes manifests),
    wave by wave, under the supervisor."""

    @contextlib.asynccontextmanager
    async def launch(
        options: LaunchOptions,
        mode: FileMode,
        stop: asyncio.Event,
        on_death: Callable[[Running], None] | None,
    ) -> AsyncIterator[Supernode]:
        run_dir = await make_run_dir(mode.run_dir)
        try:
            loaded = await asyncio.to_thread(load, options, mode, run_dir)
        except BaseException:  # nothing ran: nothing to keep
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
            raise
        # the files' own token (a secret) wins; else the options' is given to every process
        async with security_for(options, *loaded.supernodes, token=loaded.token) as security:
            env = await asyncio.to_thread(security.env, run_dir)
            waves = [
                [dataclasses.replace(spec, env={**env, **spec.env}) for spec in wave]
                for wave in loaded.waves
            ]
            # the files' `cmemu` commands forked as process mode's are (a compose file's
            # cm-mini: 31 processes, 0.45 s of CPU each exec'd, about a fifth of that forked);
            # what runs another program (mosquitto) is exec'd
            broker = any(spec.env.get(BROKER_ENV) for wave in waves for spec in wave)
            async with supervised(
                options,
                waves,
                supernodes=loaded.supernodes,
                run_dir=run_dir,
                stop=stop,
                on_death=on_death,
                security=security,
                fork=_fork_options(broker=broker),
            ) as sn:
                yield sn

    return launch


def _fork_options(*, broker: bool) -> ForkOptions | None:
    """The fork server of a launch's `cmemu` processes (preloading what a serve process with a
    broker imports when there is one), or None where $CMEMU_FORK=0 says exec every process."""
    if not fork_wanted(os.environ):
        return None
    return ForkOptions(program=CMEMU, modules=EVENT_MODULES if broker else ())


launch_compose = _from_files(_load_compose)
launch_k8s = _from_files(_load_k8s)
