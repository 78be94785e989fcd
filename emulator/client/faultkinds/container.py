"""Container faults, for an emulator run by the Docker engine (`cmemu up --mode compose`):
container-kill, -pause, -restart, -stop (with a grace period), -disconnect (a partition: the
container leaves every network; a node's target takes all its containers, a group) and -netem
(`tc netem` delay and loss inside the container). The mechanics are the engine's
(emulator/runtime/docker.py, DockerEngine); this module only registers the kinds and their ids.

As with the process kinds, the client layer reads no state file: whoever read it attaches the
engine's view (`attach_engine`; the CLI and the chaos runner do). Without one the kinds refuse
with FAILED_PRECONDITION naming the launcher that supports them.

Ids: `ctr:<target>:<kind>`. Clearing undoes: kill and stop start the container again (a fresh
process: its memory is gone, as after a reboot), pause unpauses, disconnect reconnects with the
container's aliases, netem deletes the qdisc; a restart has nothing to undo.

A (re)start holds emulated time until every device and service the container hosts serves
again (`held_time`): the engine's start and the process's imports are wall-clock work of the
emulator, not of the machine it emulates, and at time scale 20 a 15 s start would otherwise
pass as 5 emulated minutes of outage.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.clock import held_time
from cmemu.emulator.client.faultkinds.base import ActiveFault, Typed
from cmemu.emulator.client.health import status
from cmemu.emulator.model.errors import NotFoundError, PreconditionError
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, NoParams, invalid, param

log = structlog.get_logger("cmemu.faults")

# wall: how long a (re)started container may take to serve before time runs on without it
START_HOLD_MAX_S = 180.0
HEALTH_POLL_S = 0.25
SUPPORTED = "compose through the Docker engine (`cmemu up --mode compose`)"


@dataclass(frozen=True, kw_only=True)
class ContainerKillParams:
    signal: str = param("KILL", "the signal docker kill sends (KILL, TERM, ...)")

    def check(self) -> None:
        if not self.signal.isalnum() or self.signal != self.signal.upper():
            raise invalid("container-kill", "signal", f"{self.signal!r} is not a signal name")


@dataclass(frozen=True, kw_only=True)
class ContainerStopParams:
    grace_s: float = param(
        10.0, "wall seconds between SIGTERM and SIGKILL (the emulator drains on SIGTERM)",
        AT_LEAST_ZERO,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class NetemParams:
    delay_ms: float = param(0.0, "wall milliseconds added to every packet it sends", AT_LEAST_ZERO)
    jitter_ms: float = param(0.0, "+- this much on the delay", AT_LEAST_ZERO)
    loss_pct: float = param(0.0, "percent of its packets lost, [0, 100]", AT_LEAST_ZERO)

    def check(self) -> None:
        if self.loss_pct > 100:
            raise invalid("container-netem", "loss_pct", "is a percentage: at most 100")
        if not self.delay_ms and not self.loss_pct:
            raise invalid("container-netem", "delay_ms", "or loss_pct must be set")
        if self.jitter_ms and not self.delay_ms:
            raise invalid("container-netem", "jitter_ms", "needs delay_ms")


class ContainerState(Protocol):
    @property
    def service(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def networks(self) -> Mapping[str, tuple[str, ...]]: ...


class ContainerControl(Protocol):
    """What the kinds need of an engine (DockerEngine is one)."""

    project: str

    def services_of(self, target: str) -> list[str]: ...

    def hosted(self, service: str) -> tuple[str, ...]: ...

    async def containers(self) -> Sequence[ContainerState]: ...

    async def kill(self, service: str, signal: str = "KILL") -> None: ...

    async def pause(self, service: str) -> None: ...

    async def unpause(self, service: str) -> None: ...

    async def stop(self, service: str, grace_s: float) -> None: ...

    async def start(self, service: str) -> None: ...

    async def restart(self, service: str, grace_s: float) -> None: ...

    async def disconnect(self, service: str) -> None: ...

    async def reconnect(self, service: str) -> None: ...

    async def netem(
        self, service: str, *, delay_ms: float, jitter_ms: float, loss_pct: float
    ) -> None: ...

    async def clear_netem(self, service: str) -> None: ...


_ENGINES: weakref.WeakKeyDictionary[Clients, ContainerControl] = weakref.WeakKeyDictionary()


def attach_engine(clients: Clients, engine: ContainerControl) -> None:
    """Give these clients the engine's view of the emulator's containers."""
    _ENGINES[clients] = engine


def engine_of(clients: Clients, kind: str) -> ContainerControl:
    engine = _ENGINES.get(clients)
    if engine is None:
        raise PreconditionError(
            f"{kind} acts on a container: it needs the emulator run by {SUPPORTED}",
            field="kind",
            subject=kind,
            reason="LAUNCHER_UNSUPPORTED",
        )
    return engine


Act = Callable[[ContainerControl, str, Any], Awaitable[None]]


def _address(clients: Clients, ident: str) -> str:
    try:
        return clients.find(ident).address
    except NotFoundError:
        return next(s.address for s in clients.topology.services if s.id == ident)


async def _serving(clients: Clients, addresses: list[str]) -> bool:
    states = await asyncio.gather(*(status(clients.channel_to(a)) for a in addresses))
    return all(state == "SERVING" for state in states)


async def _held_start(
    clients: Clients, engine: ContainerControl, service: str, start: Awaitable[None]
) -> None:
    """`start` (the engine's start or restart of `service`) with emulated time held until what
    the container hosts serves again, or START_HOLD_MAX_S of wall time."""
    addresses = [_address(clients, ident) for ident in engine.hosted(service)]
    if not addresses:  # the broker: nothing emulated waits for it
        await start
        return
    topology, credentials = clients.topology, clients.credentials
    async with held_time(topology, credentials, name=f"starting {service}") as held:
        await start
        if not held:
            return  # it hosts the fabric, which owns time: nothing to hold
        loop = asyncio.get_running_loop()
        until = loop.time() + START_HOLD_MAX_S
        while loop.time() < until:  # polled: the process to watch is not there yet
            if await _serving(clients, addresses):
                return
            await asyncio.sleep(HEALTH_POLL_S)
        log.warning("a restarted container did not serve: time runs on", service=service)


async def _each(
    engine: ContainerControl, target: str, act: Callable[[str], Awaitable[None]]
) -> int:
    services = engine.services_of(target)
    await asyncio.gather(*(act(s) for s in services))
    return len(services)


@dataclass(frozen=True, kw_only=True)
class ContainerKind(Typed):
    act: Act
    undo: Act | None = None
    starts: str = ""  # "act" or "undo": which of the two (re)starts the container's process
    target: str = "a compose service, a device or service id it hosts, or a node (all of its)"

    def do(self, clients: Clients, engine: ContainerControl, step: str, params: Any) -> Act:
        """`act` or `undo`, with time held while it starts a process (`_held_start`)."""
        action = self.act if step == "act" else self.undo
        assert action is not None
        if step != self.starts:
            return action

        def held(e: ContainerControl, s: str, p: Any) -> Awaitable[None]:
            return _held_start(clients, e, s, action(e, s, p))

        return held

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        engine = engine_of(clients, self.name)
        act = self.do(clients, engine, "act", typed)
        count = await _each(engine, target, lambda s: act(engine, s, typed))
        return ActiveFault(
            id=str(FaultId.container(target, self.name)),
            kind=self.name,
            target=target,
            detail=f"project={engine.project} containers={count}",
        )


async def clear(clients: Clients, fault_id: FaultId) -> None:
    target, name = fault_id.subject, fault_id.kind
    kind = KINDS_BY_NAME.get(name)
    engine = engine_of(clients, name or "container fault")
    if kind is None or kind.undo is None:
        return  # a restart, or an id of no kind: nothing to undo
    undo = kind.do(clients, engine, "undo", None)
    await _each(engine, target, lambda s: undo(engine, s, None))


async def listed(clients: Clients) -> list[ActiveFault]:
    """Paused, disconnected and exited containers, as the faults that made them so."""
    engine = _ENGINES.get(clients)
    if engine is None:
        return []
    out = []
    for c in await engine.containers():
        kind = (
            "container-pause"
            if c.state == "paused"
            else "container-kill"
            if c.state in ("exited", "dead")
            else "container-disconnect"
            if c.state == "running" and not c.networks
            else ""
        )
        if kind:
            detail = f"state={c.state}" + (
                f" exit={c.exit_code}" if kind == "container-kill" else ""
            )
            out.append(
                ActiveFault(
                    id=str(FaultId.container(c.service, kind)),
                    kind=kind,
                    target=c.service,
                    detail=detail,
                )
            )
    return out


async def _kill(e: ContainerControl, s: str, p: ContainerKillParams) -> None:
    await e.kill(s, p.signal)


async def _stop(e: ContainerControl, s: str, p: ContainerStopParams) -> None:
    await e.stop(s, p.grace_s)


async def _restart(e: ContainerControl, s: str, p: ContainerStopParams) -> None:
    await e.restart(s, p.grace_s)


async def _netem(e: ContainerControl, s: str, p: NetemParams) -> None:
    await e.netem(s, delay_ms=p.delay_ms, jitter_ms=p.jitter_ms, loss_pct=p.loss_pct)


KINDS = (
    ContainerKind(
        name="container-kill",
        help="docker kill a container (compose through the engine); cleared: started again",
        params=ContainerKillParams,
        act=_kill,
        undo=lambda e, s, _: e.start(s),
        starts="undo",
    ),
    ContainerKind(
        name="container-pause",
        help="docker pause a container (every process frozen) until cleared",
        params=NoParams,
        act=lambda e, s, _: e.pause(s),
        undo=lambda e, s, _: e.unpause(s),
    ),
    ContainerKind(
        name="container-restart",
        help="docker restart a container (SIGTERM, the grace period, start)",
        params=ContainerStopParams,
        act=_restart,
        starts="act",
    ),
    ContainerKind(
        name="container-stop",
        help="docker stop a container (SIGTERM, then SIGKILL after grace_s); cleared: started",
        params=ContainerStopParams,
        act=_stop,
        undo=lambda e, s, _: e.start(s),
        starts="undo",
    ),
    ContainerKind(
        name="container-disconnect",
        help="take a container (or a node's) off its networks: a partition, until cleared",
        params=NoParams,
        act=lambda e, s, _: e.disconnect(s),
        undo=lambda e, s, _: e.reconnect(s),
    ),
    ContainerKind(
        name="container-netem",
        help="tc netem delay/loss on a container's interface (iproute2, NET_ADMIN)",
        params=NetemParams,
        act=_netem,
        undo=lambda e, s, _: e.clear_netem(s),
    ),
)
KINDS_BY_NAME = {k.name: k for k in KINDS}
