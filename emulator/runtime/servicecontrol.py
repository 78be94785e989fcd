"""The in-process supernode's services as fault targets (service-kill, service-hang,
service-slow, service-partition, and ssd-loss of EMS's SSD tier): what its devices are given as
`Siblings.services` (emulator/engines/device/kinds/service_down.py). A slow service answers every
call `latency_ms` emulated ms late (its HangGate's delay), its work going on.

A kill stops the service's gRPC server (NOT_SERVING first, then the port is freed: its clients
get UNAVAILABLE, connection refused) and suspends its background work where the service says
how (`suspend()`; the cluster manager's detection and actions); a hang leaves the server bound
and accepting, and answers nothing (its HangGate, health included: clients hit their deadlines).
Back: a new server on the same address with the service's state as it was, SERVING again, its
work resumed (`resume()`). Kept across the kill: what the service holds in memory (as if
journaled); lost: calls in flight and the background work in flight. Each is an event on the
service's own topic (`service-down`, `service-up`) beside its health.

A partition answers nothing, as a hang does (its packets are dropped), but the service runs on:
the cluster manager, the one service whose engine reaches devices in process, reaches nothing
either (`partition()`: its Link, emulator/engines/manager/link.py), so its detection and
actions see a silent supernode; a service with no such hook has its background work suspended
instead (every call it would make would be lost).

The fabric is not stopped but gated: in process the devices reach its engine directly, so its
Outage (emulator/engines/fabric/outage.py) is what they meet, and its server keeps telling the
emulator's time (GetClock, SyncClock are exempt from its gate) while refusing (killed) or
answering nothing (hung, cut off) else. The scheduler and EMS are stopped or gated as any
service, and their Outage (emulator/engines/outage.py) set beside: the router and the training
jobs of this process reach their engines directly (services/peers.py), and meet that. So are
the router's and the manager's: the cluster manager and the scheduler's day plans reach the
router's engine directly, and the day plans the training jobs the manager's server hosts.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.device.kinds.service_down import ServiceDownParams
from cmemu.emulator.engines.outage import Outage
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.topology import ServiceKind

if TYPE_CHECKING:
    from cmemu.emulator.runtime.inprocess import InProcessSupernode
    from cmemu.emulator.runtime.registry import ServiceState
    from cmemu.services.host import ServiceHost

log = structlog.get_logger("cmemu.services")


class LocalServices:
    """ServiceControl over the services one InProcessSupernode hosts."""

    def __init__(self, supernode: InProcessSupernode) -> None:
        self.supernode = supernode

    def hosted(self) -> Collection[str]:
        return [k.value for k in self.supernode.services]

    def _publish(self, name: str, event: str, **detail: str) -> None:
        sn = self.supernode
        if sn.events is not None and sn.time is not None:
            sn.events.event(name, event, sn.time.timeline.now_ns(), **detail)

    def _hosted(self, service: str) -> tuple[ServiceState, ServiceHost] | None:
        return self.supernode.services.get(ServiceKind(service))

    async def down(self, fault: ServiceDownParams) -> None:
        hosted = self._hosted(fault.service)
        if hosted is None:
            raise PreconditionError(f"this process does not host the {fault.service} service")
        state, host = hosted
        how = _how(fault)
        if fault.service == ServiceKind.FABRIC.value:
            await self._fabric(state, host, how, fault.latency_ms)
            return
        outage = _outage(state)
        if how == "slow":
            host.gate.delay = self._late(fault.latency_ms)
            if outage is not None:
                outage.down(how, host.gate.delay)
            self._publish(host.name, "service-down", how=how, latency_ms=f"{fault.latency_ms:g}")
            return  # its work goes on: only its answers are late
        if outage is not None:  # what its callers in this process meet
            outage.down(how)
        if how == "partition":
            host.gate.answering.clear()  # its packets are dropped: callers hit their deadlines
            partition = getattr(state, "partition", None)
            if partition is not None:
                partition(True)  # it runs on, reaching nothing
            else:
                await _suspended(state)
            log.warning("service partitioned", service=host.name)
            self._publish(host.name, "service-down", how=how)
            return
        if how == "hang":
            host.gate.answering.clear()
        else:
            await host.stop(0)
            self._publish(host.name, "health", status="NOT_SERVING")
        await _suspended(state)
        log.warning("service down", service=host.name, how=how)
        self._publish(host.name, "service-down", how=how)

    async def up(self, fault: ServiceDownParams) -> None:
        hosted = self._hosted(fault.service)
        if hosted is None:
            return  # the supernode is stopping: nothing to bring back
        state, host = hosted
        how = _how(fault)
        if fault.service == ServiceKind.FABRIC.value:
            await self._fabric(state, host, "", 0.0)
            return
        outage = _outage(state)
        if outage is not None:
            outage.up()
        if how == "slow":
            host.gate.delay = None
            self._publish(host.name, "service-up", how=how)
            return
        if how == "partition":
            host.gate.answering.set()
            partition = getattr(state, "partition", None)
            if partition is not None:
                partition(False)
                log.warning("service back", service=host.name, how=how)
                self._publish(host.name, "service-up", how=how)
                return
        elif how == "hang":
            host.gate.answering.set()
        else:
            host.secure(host.security)  # a stopped grpc server cannot start again
            await host.start()
            await host.set_serving(True)
            self._publish(host.name, "health", status="SERVING")
        resume = getattr(state, "resume", None)
        if resume is not None:
            back = resume()
            if inspect.isawaitable(back):
                await back
        log.warning("service back", service=host.name, how=how)
        self._publish(host.name, "service-up", how=how)

    def _late(self, latency_ms: float) -> Callable[[], Awaitable[None]]:
        """A service-slow delay: `latency_ms` of emulated time before each call."""
        clock = self.supernode.time
        assert clock is not None, "a started supernode keeps time"
        late_s = latency_ms / 1e3
        return lambda: clock.timeline.sleep(late_s)

    async def _fabric(
        self, state: ServiceState, host: ServiceHost, how: str, latency_ms: float
    ) -> None:
        """The fabric down (`how`) or back (""): its server gated, its clock calls exempt, and
        the devices of this process, which reach its engine directly, through its Outage."""
        from cmemu.emulator.engines.fabric.engine import FabricEngine  # this process hosts it

        assert isinstance(state, FabricEngine)
        outage, gate = state.outage, host.gate
        gate.refusing, gate.delay = "", None
        gate.answering.set()
        if not how:
            outage.up()
            log.warning("service back", service=host.name)
            self._publish(host.name, "service-up")
            return
        delay = None
        if how == "slow":
            delay = gate.delay = self._late(latency_ms)
        elif how == "kill":
            gate.refusing = "the fabric service is down (service-kill)"
        else:
            gate.answering.clear()  # hang, partition: nothing answered
        outage.down(how, delay)
        log.warning("service down", service=host.name, how=how)
        self._publish(host.name, "service-down", how=how)

    async def ssd(self, *, lost: bool) -> None:
        """EMS's SSD tier fails (ssd-loss) or is replaced."""
        from cmemu.emulator.engines.ems import EmsState  # imported by the process hosting it

        hosted = self._hosted(ServiceKind.EMS.value)
        if hosted is None:
            if lost:
                raise PreconditionError("this process does not host the ems service")
            return  # the supernode is stopping
        state = hosted[0]
        assert isinstance(state, EmsState)
        if lost:
            await state.lose_ssd()
        else:
            state.replace_ssd()


async def _suspended(state: ServiceState) -> None:
    suspend = getattr(state, "suspend", None)
    if suspend is not None:
        await suspend()


def _outage(state: ServiceState) -> Outage | None:
    """The service's outage, when callers of this process reach its engine directly."""
    outage = getattr(state, "outage", None)
    return outage if isinstance(outage, Outage) else None


def _how(fault: ServiceDownParams) -> str:
    if fault.partition:
        return "partition"
    return "hang" if fault.hang else "slow" if fault.latency_ms else "kill"
