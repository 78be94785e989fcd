"""process-kill and process-pause: SIGKILL / SIGSTOP of an emulator process, in the procs launcher
(one process per device, node or service; their pids are in the state file). Every server the
process hosts is gone (kill: the launcher publishes a `died` event for each) or frozen (pause:
connections stay open, nothing answers, as a hung host). Clearing a pause sends SIGCONT; a killed
process stays dead (the launcher does not restart it), so clearing a kill only forgets it.

The client layer reads no state file: the launcher's process table is attached to the clients by
whoever read it (`attach_processes`; the CLI and the chaos runner do). Without one (in-process,
compose) the kinds refuse with FAILED_PRECONDITION naming the launcher that supports them.
"""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import ActiveFault, Typed
from cmemu.emulator.model.errors import NotFoundError, PreconditionError, quote
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.faults.params import NoParams

SUPPORTED = "procs"  # the launcher whose processes these kinds signal


@dataclass(frozen=True, kw_only=True)
class Process:
    name: str
    pid: int
    servers: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ProcessTable:
    mode: str  # the launcher's: inprocess, procs, compose
    processes: Mapping[str, Process] = field(default_factory=dict)


_TABLES: weakref.WeakKeyDictionary[Clients, ProcessTable] = weakref.WeakKeyDictionary()


def attach_processes(clients: Clients, table: ProcessTable) -> None:
    """Give these clients the launcher's processes (from its state file)."""
    _TABLES[clients] = table


def tables() -> weakref.WeakKeyDictionary[Clients, ProcessTable]:
    """Every clients' attached table (service-kill picks its way by the launcher's mode)."""
    return _TABLES


def table_of(clients: Clients, kind: str) -> ProcessTable:
    table = _TABLES.get(clients)
    if table is None or table.mode != SUPPORTED or not table.processes:
        mode = table.mode if table is not None else "unknown"
        raise PreconditionError(
            f"{kind} signals an emulator process: it needs the {SUPPORTED} launcher "
            f"(`cmemu up --mode {SUPPORTED}`), whose state file records each process's pid; "
            f"this emulator runs {mode}",
            field="kind",
            subject=kind,
            reason="LAUNCHER_UNSUPPORTED",
        )
    return table


def process_of(table: ProcessTable, target: str) -> Process:
    """A process by name, or the one that hosts a device or service id."""
    if target in table.processes:
        return table.processes[target]
    for process in table.processes.values():
        if target in process.servers:
            return process
    raise NotFoundError(
        f"no process {quote(target)} and none hosts it; processes: "
        f"{', '.join(sorted(table.processes)[:6])}...",
        field="target",
        subject=target,
        reason="PROCESS_NOT_FOUND",
    )


def signal_process(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise NotFoundError(f"process {pid} is gone", subject=str(pid)) from None


def paused(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP): its state in /proc is T."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


@dataclass(frozen=True, kw_only=True)
class ProcessKind(Typed):
    signal: signal.Signals = signal.SIGKILL
    target: str = "a process name, or a device or service id it hosts"

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        self.typed(params)
        process = process_of(table_of(clients, self.name), target)
        signal_process(process.pid, self.signal)
        return ActiveFault(
            id=str(FaultId.process(process.name, self.name)),
            kind=self.name,
            target=process.name,
            detail=f"pid={process.pid} servers={len(process.servers)}",
        )


def listed(clients: Clients) -> list[ActiveFault]:
    """The paused processes (a killed one is not told from a crashed one: not listed)."""
    table = _TABLES.get(clients)
    if table is None or table.mode != SUPPORTED:
        return []
    return [
        ActiveFault(
            id=str(FaultId.process(p.name, "process-pause")),
            kind="process-pause",
            target=p.name,
            detail=f"pid={p.pid}",
        )
        for p in table.processes.values()
        if paused(p.pid)
    ]


async def clear(clients: Clients, fault_id: FaultId) -> None:
    """`proc:<process>:<kind>`: a pause is ended (SIGCONT); a kill only forgotten."""
    process = process_of(table_of(clients, fault_id.kind), fault_id.subject)
    if fault_id.kind == "process-pause":
        signal_process(process.pid, signal.SIGCONT)


KILL = ProcessKind(
    name="process-kill", help="SIGKILL an emulator process (procs launcher)", params=NoParams
)
PAUSE = ProcessKind(
    name="process-pause",
    help="SIGSTOP an emulator process until cleared (procs launcher)",
    params=NoParams,
    signal=signal.SIGSTOP,
)
