"""Attach to a running instance by its name (issue 18 item 5): what `cmemu ls --name X`,
`cmemu fault --name X` and `cmemu down --name X` find through the state file, as one typed
object for Python: the topology, typed clients with the instance's token and CA, the launcher's
pid and mode, and a stop.

    async with instance.start(options, name="lab"):      # here, or `cmemu up --name lab`
        ...
    async with attach("lab") as lab:                      # anywhere on this host
        await lab.clients.device("n00-npu0").GetInfo(...)
        await lab.stop()                                  # as `cmemu down --name lab`

The stop of an instance another process hosts is SIGTERM to its launcher (what `cmemu up`
stops on); of one this process hosts (instance.start), the stop its host waits for
(`Hosted.wait_stop`): a signal to this process would stop more than the instance.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.model.errors import NotFoundError, UnavailableError
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime import state

STOP_TIMEOUT_S = 60.0  # as `cmemu down`'s default
_POLL_S = 0.02  # how often a stop looks whether the state file is gone

# the instances this process hosts (instance.start): state file -> (their loop, their stop)
HOSTED: dict[Path, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}


class StaleInstanceError(NotFoundError):
    """The state file is there but the launcher that wrote it is gone (killed, crashed): the
    instance is not running, and nothing answers at its addresses."""

    def __init__(self, name: str, pid: int, path: Path) -> None:
        self.name = name
        self.pid = pid
        self.path = path
        super().__init__(
            f"instance {name!r} is not running: its launcher (pid {pid}) is gone and its state "
            f"file {path} is stale (`cmemu down{state.name_option(name)}` removes it)"
        )


@dataclass(eq=False, kw_only=True)
class Attached:
    """A running instance found by its state file: what a client of it needs, and its stop.
    Close it (or leave its `async with`) to close the clients' channels; the instance runs on."""

    name: str
    path: Path
    launcher: state.Launcher
    supernodes: tuple[Topology, ...]
    clients: Clients  # with the token and CA, the process table and the engine's containers

    @property
    def topology(self) -> Topology:
        """The first supernode's document (the only one, but for a `<base>x<N>` preset)."""
        return self.supernodes[0]

    @property
    def credentials(self) -> Credentials:
        """What a client of it presents: the token (its file's) and the CA."""
        return self.clients.credentials

    @property
    def token(self) -> str | None:
        return self.credentials.token

    @property
    def tls_ca(self) -> Path | None:
        """The CA that signed its servers' certificates (None: plaintext)."""
        ca = self.launcher.extra.get(state.TLS_CA_KEY)
        return Path(ca) if ca else None

    @property
    def pid(self) -> int:
        """Its launcher's process (this process, for an instance hosted here)."""
        return self.launcher.pid

    @property
    def mode(self) -> str:
        """As `cmemu status` shows it: `inprocess`, `procs per node`, `compose FILE`..."""
        return self.launcher.mode

    @property
    def alive(self) -> bool:
        return state.pid_alive(self.pid)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the instance and wait until its state file is gone (its servers NOT_SERVING
        and stopping) and, for another process's, until its launcher has exited;
        UnavailableError when that takes longer than `timeout_s`."""
        hosted = HOSTED.get(self.path.resolve())
        if hosted is not None and self.pid == os.getpid():
            loop, stop = hosted
            loop.call_soon_threadsafe(stop.set)
        else:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                raise StaleInstanceError(self.name, self.pid, self.path) from None
        try:
            async with asyncio.timeout(timeout_s):
                # the file goes, then (another process) the launcher exits: nothing to
                # wait on but their absence, looked at every _POLL_S
                while await asyncio.to_thread(self._running):  # noqa: ASYNC110
                    await asyncio.sleep(_POLL_S)
        except TimeoutError:
            raise UnavailableError(
                f"instance {self.name!r} (pid {self.pid}) still running {timeout_s:g} s after "
                "the stop was asked"
                + ("" if hosted else f"; `kill -KILL {self.pid}` stops it for good")
            ) from None
        await self.close()

    def _running(self) -> bool:
        """Its state file is still its launcher's, or its launcher (not this process) lives."""
        if self.pid != os.getpid() and state.pid_alive(self.pid):
            return True
        try:
            return state.read_instance(self.path).launcher.pid == self.pid
        except (NotFoundError, ValueError, OSError):
            return False

    async def close(self) -> None:
        """Close the clients' channels (the instance runs on)."""
        await self.clients.close()

    async def __aenter__(self) -> Attached:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def attach(name: str = state.DEFAULT_NAME, *, path: Path | None = None) -> Attached:
    """The running instance called `name` (its state file in the state directory), or the one
    whose state file is `path`. NotFoundError naming the name and the directory when there is
    none; StaleInstanceError when its launcher is gone; InvalidArgumentError for a name that is
    not a DNS label or a file that is not a state file."""
    where = path if path is not None else state.path_for(name)
    if not where.exists():
        raise NotFoundError(
            f"no instance {state.instance_name(where)!r} running: no state file {where.name} in "
            f"{where.parent} (start one with `cmemu up"
            f"{state.name_option(state.instance_name(where))}` or instance.start)"
        )
    found = state.read_instance(where)
    if not found.alive:
        raise StaleInstanceError(found.name, found.launcher.pid, where)
    return Attached(
        name=found.name,
        path=where,
        launcher=found.launcher,
        supernodes=found.supernodes,
        clients=state.fault_clients(where),
    )
