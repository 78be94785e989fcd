"""The typed launch API: one call starts a supernode in any mode and stops all of it on exit.

    async with Supernode.start(LaunchOptions(preset="cm384", mode=Procs(per="node"))) as sn:
        await sn.clients.device("n00-npu0").GetInfo(...)

Every mode consumes one topology document; they differ only in where the servers run:
- inprocess: every server in this process (the embedded default of `cmemu up`);
- procs: the fabric, then one OS process per device or per node, then EMS, each `cmemu serve`
  on its own loopback address, under a supervisor that restarts nothing;
- compose: exactly the services of a compose file, as local processes;
- k8s: exactly the containers of Kubernetes manifests (`cmemu k8s`), as local processes.
The CLI, the benchmarks and the tests are thin users of it.

The options are in launchoptions.py (one typed class per mode: launchmodes.py); the launchers
(launchers.py, procslaunch.py, enginelaunch.py) build the running Supernode this module
describes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.docker import DockerEngine
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.runtime.launchoptions import (
    ADDRESSING,
    CMEMU,
    EMBEDDED,
    MODES,
    NO_BROKER,
    Addressing,
    Compose,
    Docker,
    InProcess,
    K8s,
    LaunchOptions,
    Mode,
    ModeOptions,
    Procs,
    Progress,
    StartInterrupted,
)
from cmemu.emulator.runtime.procs import Running, Supervisor
from cmemu.emulator.runtime.security import NONE as NO_SECURITY
from cmemu.emulator.runtime.security import Security
from cmemu.services.kinds import DeviceServer

M = TypeVar("M", bound=ModeOptions)

__all__ = [
    "ADDRESSING",
    "CMEMU",
    "EMBEDDED",
    "MODES",
    "NO_BROKER",
    "Addressing",
    "Compose",
    "Docker",
    "InProcess",
    "K8s",
    "LaunchOptions",
    "Launcher",
    "Mode",
    "ModeOptions",
    "Procs",
    "Progress",
    "StartInterrupted",
    "Supernode",
]


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
    def device_servers(self) -> dict[str, DeviceServer]:
        """Every device server this process hosts, of every supernode, by id (none but in
        process)."""
        return {d: s for local in self.inprocesses for d, s in local.device_servers.items()}

    @property
    def credentials(self) -> Credentials:
        """What a client of this supernode presents: the token and the CA."""
        return self.clients.credentials

    @property
    def mode(self) -> str:
        """What `cmemu status` shows: the mode and its flavour."""
        return self.options.mode.describe(self.options.preset)

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
        """Start the supernode; the context yields once every server serves (over gRPC; in one
        process by its own health, one of each kind over gRPC) and stops everything on exit.
        `stop`, set while starting, aborts the start (StartInterrupted); `on_death` hears of
        every process that exits on its own."""
        from cmemu.emulator.runtime.launchers import start  # they build Supernodes: no cycle

        return start(options, stop=stop or asyncio.Event(), on_death=on_death)


Launcher = Callable[
    [LaunchOptions, M, asyncio.Event, Callable[[Running], None] | None],
    AbstractAsyncContextManager[Supernode],
]
"""A mode's launcher: the options, the mode's own (`options.mode`, typed), the stop event and
who hears of a process's death."""
