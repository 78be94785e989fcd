"""Deaths are events: a supervised process that exits on its own publishes nothing itself (it is
gone), so its launcher publishes a `died` event for every server it hosted, on the same topics,
at the same QoS and in the same shape as every other event:

    cmemu/<supernode>/<device>/events  {"device", "event": "died", "emulated_ns", "wall",
                                        "exit_code", "pid", "process", "log"}

The launcher owns its own EventBus for it (the broker's URL comes from the topology document),
so a death reaches subscribers even while the dead process's neighbours keep serving.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from cmemu.emulator.model.naming import parse_id
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.events import EventBus
from cmemu.emulator.runtime.procs import Running

log = structlog.get_logger("cmemu.deaths")
DIED = "died"


@dataclass(kw_only=True)
class DeathReporter:
    """The supervisor's `on_exit`: a `died` event per hosted server, then the caller's own
    callback. `topology` may be replaced once its epoch is known (compose: from the fabric)."""

    topology: Topology
    bus: EventBus | None
    then: Callable[[Running], None] | None = None
    # with several supernodes, the bus of each other one (its servers' topics carry its name)
    others: dict[int, EventBus] = field(default_factory=dict)
    # emulated time, as the launcher follows it once the fabric serves (None before)
    now_ns: Callable[[], int] | None = None

    def __call__(self, running: Running) -> None:
        self.report(
            running.spec.servers,
            exit_code=running.returncode,
            pid=running.proc.pid,
            process=running.spec.name,
            log=str(running.log_path),
        )
        if self.then is not None:
            self.then(running)

    def report(
        self, servers: Sequence[str], *, exit_code: int | None, pid: int, process: str, log: str
    ) -> None:
        """A `died` event for each server of a process (or container) that exited."""
        if self.bus is None:
            return
        now = self.now_ns() if self.now_ns is not None else 0  # 0: before the clock began
        for server in servers:
            bus = self.others.get(parse_id(server).supernode, self.bus)
            bus.event(server, DIED, now, exit_code=exit_code, pid=pid, process=process, log=log)


@contextlib.asynccontextmanager
async def death_reporter(
    supernodes: tuple[Topology, ...],
    then: Callable[[Running], None] | None,
    *,
    login: Mapping[str, str] | None = None,
) -> AsyncIterator[DeathReporter]:
    """A reporter publishing through a bus of its own per supernode while the block runs (none
    without a broker), logged in with `login` (`Security.mqtt_login`) when the broker wants it;
    on exit the buses give the last events a moment to leave."""
    topology = supernodes[0]
    broker = topology.broker
    if broker is None:
        yield DeathReporter(topology=topology, bus=None, then=then)
        return
    async with contextlib.AsyncExitStack() as stack:
        buses = {}
        for t in supernodes:
            # one supernode's worth of deaths (a node's servers each, or all at once) fits
            buses[t.index] = await stack.enter_async_context(
                EventBus(
                    broker,
                    t.supernode,
                    buffer_max=max(10_000, 2 * (len(t.devices) + len(t.services))),
                    **(login or {}),
                )
            )
        yield DeathReporter(topology=topology, bus=buses[topology.index], then=then, others=buses)
