"""The catalogue's device faults, as a device shows them: one effect per kind, registered by name.

- crash: the device's gRPC server is stopped and its port freed (clients get UNAVAILABLE,
  connection refused); in-process callers get the same UNAVAILABLE (reason PEER_UNREACHABLE).
  It comes back when the fault clears: a new server on the same address, empty of volatile
  state (inbox, engine queues) and, with `wipe` (the default), of its memory too: regions and
  contents are gone, as a reset reinitialises HBM and DRAM. `wipe=false` keeps them.
- hang: every call is accepted and never answered, the health Check included; calls in flight
  proceed when it clears. The fault methods of the Device service still answer (a BMC).
- slow: kernels take 1/compute as long; with link < 1 the fabric degrades the device's UB ports
  (fabric kind `ports-degraded`), cleared with it.
- hbm-ecc: a region or address range is poisoned: reads and atomics touching it fail DATA_LOSS
  (reason HBM_UNCORRECTABLE_ECC), counted in telemetry (ecc_uncorrectable_errors); a write over
  poisoned bytes heals them; clearing the fault scrubs what is left.
- die-down: one NPU die fails: kernels on it and UB accesses to its HBM half are UNAVAILABLE
  (reason DIE_DOWN), its health name "<npu>.d<die>" turns NOT_SERVING while the server ("")
  stays SERVING (the NPU is degraded), and telemetry lists it in dies_down.
- pool-loss: a memory pool crashes with its contents lost (EMS re-replicates what it held).

A crashed device's server is gone, so its faults are injected, listed and cleared through any
device hosted in the same process (FaultState.device names the target): the process's FaultHost
knows each of its devices' servers. Each fault may carry a duration (for_s, emulated); the
device's process clears it itself when it ends. Every injection and clearance is an event
`fault` / `fault-cleared` on the device's topic, with emulated timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from cmemu.v1 import device_pb2, fabric_pb2
from emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    quote,
)
from emulator.model.faults.catalogue import PARAMS, CrashParams, HbmEccParams, SlowParams
from emulator.model.faults.params import params_from, params_text
from emulator.model.topology import DeviceKind
from services.host import NOT_SERVING, SERVING, ServiceHost

if TYPE_CHECKING:  # services/device.py serves these operations: no import cycle at run time
    from services.device import DeviceState

log = structlog.get_logger("cmemu.faults")

SELF_STOP_DELAY_S = 0.05  # a device crashing itself answers first, then its server stops
DEVICE_DOWN = "device-down"  # the older fault (SetFaultState), listed and cleared here too


@dataclass
class Active:
    """One active fault of one device."""

    kind: str
    params: Any
    since_ns: int
    until_ns: int = 0
    for_s: float = 0.0
    timer: asyncio.TimerHandle | None = None
    fabric_fault: str = ""  # slow: the fabric fault degrading its ports
    by_itself: bool = False  # injected through the device's own server (a crash waits)

    def proto(self, device: str) -> device_pb2.FaultState:
        return device_pb2.FaultState(
            faulted=True,
            kind=self.kind,
            params=params_text(self.params),
            since_ns=self.since_ns,
            until_ns=self.until_ns,
            for_s=self.for_s,
            device=device,
        )


class Effect(Protocol):
    """What one kind does to a device, and how it is undone."""

    @property
    def on(self) -> frozenset[DeviceKind]: ...

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None: ...

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None: ...


ALL = frozenset(DeviceKind)
CRASHES = ("crash", "pool-loss")  # kinds whose device has no server while they last


def _wipe(state: DeviceState) -> None:
    """A reset: regions, contents and poison gone."""
    memory = state.memory
    for region in memory.allocator.regions():
        memory.free(region.region_id)
    state.effects.poison.clear()


def _drop_volatile(state: DeviceState) -> None:
    """What a restart never keeps: queued messages and kernels."""
    while not state.inbox.empty():
        message = state.inbox.get_nowait()
        if state.queue_budget is not None:
            state.queue_budget.give(len(message.data))
    now = state.clock.now_ns()
    for engine in state.engines:
        engine.busy_until_ns = min(engine.busy_until_ns, now)


@dataclass(frozen=True)
class Crash:
    on: frozenset[DeviceKind] = ALL
    wipe_always: bool = False  # pool-loss: the contents are always lost

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        already = state.effects.crashed  # a pool lost while its node is powered off
        state.effects.crashed = True
        _drop_volatile(state)
        if self.wipe_always or (isinstance(fault.params, CrashParams) and fault.params.wipe):
            _wipe(state)
        if not already:
            await host.stop_server(state, deferred=fault.by_itself)

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        if any(kind in state.catalogue for kind in CRASHES):
            return  # still down for another reason
        state.effects.crashed = False
        await host.restart_server(state)


@dataclass(frozen=True)
class Hang:
    on: frozenset[DeviceKind] = ALL

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        state.effects.answering.clear()

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        state.effects.answering.set()


@dataclass(frozen=True)
class Slow:
    on: frozenset[DeviceKind] = ALL

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        params: SlowParams = fault.params
        if params.compute < 1 and not state.engines:
            raise PreconditionError(
                f"{state.device.id} runs no kernels: slow it with link=, not compute=",
                field="params.compute",
                subject=state.device.id,
                reason="WRONG_DEVICE_KIND",
            )
        if params.link < 1:
            stored = await state.peers.fabric().InjectFault(
                fabric_pb2.FabricFault(
                    kind="ports-degraded", target=state.device.id, factor=params.link
                ),
                timeout=10.0,
            )
            fault.fabric_fault = stored.id
        state.effects.compute_share = params.compute

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        state.effects.compute_share = 1.0
        if fault.fabric_fault:
            with contextlib.suppress(Exception):  # the fabric may have been cleared already
                await state.peers.fabric().ClearFault(
                    fabric_pb2.ClearFaultRequest(id=fault.fabric_fault), timeout=10.0
                )


def _ecc_range(state: DeviceState, params: HbmEccParams) -> tuple[int, int]:
    if params.region:
        for region in state.memory.allocator.regions():
            if region.region_id == params.region:
                return region.offset, region.end
        raise NotFoundError(
            f"{state.device.id} has no region {params.region}",
            field="params.region",
            subject=str(params.region),
            reason="REGION_NOT_FOUND",
        )
    end = params.offset + params.size
    if end > state.memory.capacity:
        raise OutOfRangeError(
            f"[{params.offset}, {end}) is outside {state.device.id}'s"
            f" {state.memory.capacity} bytes",
            field="params.offset",
            subject=state.device.id,
        )
    return params.offset, end


@dataclass(frozen=True)
class HbmEcc:
    on: frozenset[DeviceKind] = ALL

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        start, end = _ecc_range(state, fault.params)
        fault.params = HbmEccParams(offset=start, size=end - start)  # what stays poisoned
        state.effects.poison.add(start, end)

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        state.effects.poison.heal(fault.params.offset, fault.params.size)


@dataclass(frozen=True)
class DieDown:
    on: frozenset[DeviceKind] = frozenset({DeviceKind.NPU})

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        die = fault.params.die
        if die >= len(state.engines):
            raise InvalidArgumentError(
                f"die-down: {state.device.id} has dies 0 to {len(state.engines) - 1}, not {die}",
                field="params.die",
                subject=state.device.id,
                reason="INVALID_FAULT_PARAM",
            )
        state.effects.dies_down.add(die)
        await host.die_health(state, die, serving=False)

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        die = fault.params.die
        state.effects.dies_down.discard(die)
        await host.die_health(state, die, serving=True)


@dataclass(frozen=True)
class DeviceDown:
    """The older fault (SetFaultState) with a duration: NOT_SERVING, UB and compute refused."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        if state.fault.faulted:
            raise PreconditionError(
                f"{state.device.id} is down already; clear it first",
                field="kind",
                subject=state.device.id,
                reason="FAULT_ALREADY_ACTIVE",
            )
        await state.set_fault(True, fault.params.reason, announce=False)

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        await state.set_fault(False, "", announce=False)


@dataclass(frozen=True)
class BrokerOutage:
    """The broker unreachable from this device's process: its event publisher lets go and
    buffers (emulator/runtime/events.py EventBus.hold) until the fault clears."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        hold = getattr(state.events, "hold", None)
        if hold is None:
            raise PreconditionError(
                f"{state.device.id}'s process publishes no events (no MQTT broker)",
                subject=state.device.id,
                reason="NO_BROKER",
            )
        for sibling in host.states.values():  # one publisher per process: one outage
            if sibling is not state and "broker-outage" in sibling.catalogue:
                raise PreconditionError(
                    f"this process's broker outage is on {sibling.device.id} already",
                    subject=sibling.device.id,
                    reason="FAULT_ALREADY_ACTIVE",
                )
        hold(True)

    async def undo(self, state: DeviceState, fault: Active, host: FaultHost) -> None:
        hold = getattr(state.events, "hold", None)
        if hold is not None:
            hold(False)


EFFECTS: dict[str, Effect] = {
    "device-down": DeviceDown(),
    "broker-outage": BrokerOutage(),
    "crash": Crash(),
    "hang": Hang(),
    "slow": Slow(),
    "hbm-ecc": HbmEcc(),
    "die-down": DieDown(),
    "pool-loss": Crash(on=frozenset({DeviceKind.MEMPOOL}), wipe_always=True),
}
"""Every kind a device applies itself, by name (the client's KINDS table names them too)."""


def die_name(device: str, die: int) -> str:
    """A die's health service name: the die's id, "n00-npu3.d1"."""
    return f"{device}.d{die}"


class FaultHost:
    """The devices of one process, for their faults: each one's server (stopped by a crash,
    rebuilt when it clears) and the siblings a request may name. Owns the duration timers and
    the tasks they start; `close` ends them."""

    def __init__(self, devices: Mapping[str, tuple[DeviceState, ServiceHost]]) -> None:
        self.states = {d: s for d, (s, _) in devices.items()}
        self.hosts = {d: h for d, (_, h) in devices.items()}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        for device, (state, host) in devices.items():
            state.fault_host = self
            state.effects.answering = host.gate.answering
            state.on_health = self._health_of(state)
            if state.device.kind is DeviceKind.NPU:
                host.extra_health = [die_name(device, d) for d in range(len(state.engines))]

    def _health_of(self, state: DeviceState) -> Callable[[bool], Awaitable[None]]:
        async def set_serving(serving: bool) -> None:
            await self.set_serving(state, serving)

        return set_serving

    async def set_serving(self, state: DeviceState, serving: bool) -> None:
        host = self.hosts[state.device.id]
        await host.set_serving(serving)
        for die in state.effects.dies_down:
            await host.health.set(die_name(state.device.id, die), NOT_SERVING)

    async def die_health(self, state: DeviceState, die: int, *, serving: bool) -> None:
        up = serving and not state.fault.faulted
        name = die_name(state.device.id, die)
        await self.hosts[state.device.id].health.set(name, SERVING if up else NOT_SERVING)
        state.publish("health", service=name, status="SERVING" if up else "NOT_SERVING")

    def spawn(self, work: Awaitable[object], name: str) -> None:
        async def run() -> None:
            try:
                await work
            except EmulatorError as exc:
                log.error("fault timer failed", task=name, error=str(exc))

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop_server(self, state: DeviceState, *, deferred: bool) -> None:
        """The server gone, its port free. A device that stops itself answers first."""
        host = self.hosts[state.device.id]
        await host.set_serving(False)
        state.publish("health", status="NOT_SERVING")
        if deferred:
            self.spawn(self._stop_later(host), f"{state.device.id}-crash")
        else:
            await host.server.stop(0)

    async def _stop_later(self, host: ServiceHost) -> None:
        await asyncio.sleep(SELF_STOP_DELAY_S)
        await host.server.stop(0)

    async def restart_server(self, state: DeviceState) -> None:
        host = self.hosts[state.device.id]
        with contextlib.suppress(Exception):
            await host.server.stop(0)  # a self-crash's deferred stop may still be pending
        host.secure(host.security)  # a stopped grpc server cannot start again: a new one
        await host.start()
        await self.set_serving(state, not state.fault.faulted)
        state.publish("health", status="NOT_SERVING" if state.fault.faulted else "SERVING")

    def close(self) -> None:
        """End every duration timer and task (the supernode stops)."""
        self.closed = True
        for state in self.states.values():
            for fault in state.catalogue.values():
                if fault.timer is not None:
                    fault.timer.cancel()
        for task in list(self.tasks):
            task.cancel()


# --- the operations behind Device/InjectFault, ClearFault, ListFaults ----------------------------


def _target(caller: DeviceState, device: str) -> tuple[DeviceState, FaultHost]:
    host = caller.fault_host
    if not isinstance(host, FaultHost):
        raise PreconditionError(
            f"{caller.device.id} takes no faults: its launcher keeps no fault host",
            subject=caller.device.id,
            reason="NO_FAULT_HOST",
        )
    if not device or device == caller.device.id:
        return caller, host
    caller.topology.device(device)  # NotFoundError for a device that does not exist
    target = host.states.get(device)
    if target is None:
        raise PreconditionError(
            f"{device} is not hosted in {caller.device.id}'s process: ask one of its siblings",
            field="device",
            subject=device,
            reason="NOT_IN_PROCESS",
        )
    return target, host


def _duration(for_s: float) -> float:
    if not math.isfinite(for_s) or for_s < 0:
        raise InvalidArgumentError(
            f"for_s must be finite and >= 0 (0: until cleared), got {for_s}", field="for_s"
        )
    return for_s


async def inject(caller: DeviceState, request: device_pb2.FaultState) -> device_pb2.FaultState:
    target, host = _target(caller, request.device)
    kind = request.kind
    effect = EFFECTS.get(kind)
    if effect is None:
        raise InvalidArgumentError(
            f"{quote(kind)} is no device fault kind; known: {', '.join(EFFECTS)}",
            field="kind",
            subject=kind,
            reason="UNKNOWN_FAULT_KIND",
        )
    device = target.device
    if device.kind not in effect.on:
        on = ", ".join(sorted(k.value for k in effect.on))
        raise PreconditionError(
            f"{kind} applies to {on}; {device.id} is a {device.kind.value}",
            field="device",
            subject=device.id,
            reason="WRONG_DEVICE_KIND",
        )
    params = params_from(PARAMS[kind], dict(request.params), kind=kind)
    for_s = _duration(request.for_s)
    if kind in target.catalogue:
        raise PreconditionError(
            f"{device.id} already has a {kind} fault; clear it first",
            field="kind",
            subject=device.id,
            reason="FAULT_ALREADY_ACTIVE",
        )
    now = target.clock.now_ns()
    fault = Active(
        kind=kind,
        params=params,
        since_ns=now,
        for_s=for_s,
        until_ns=now + round(for_s * 1e9) if for_s else 0,
        by_itself=target is caller,
    )
    target.catalogue[kind] = fault  # held before applying: a second injection is refused
    try:
        await effect.apply(target, fault, host)
    except BaseException:
        del target.catalogue[kind]
        raise
    if for_s:
        fault.timer = asyncio.get_running_loop().call_later(
            target.clock.wall_delay_s(for_s), _expire, target, kind, fault
        )
    target.log.warning("fault", kind=kind, params=params_text(fault.params), for_s=for_s)
    target.publish("fault", fault=kind, params=params_text(fault.params), until_ns=fault.until_ns)
    return fault.proto(device.id)


def _expire(state: DeviceState, kind: str, fault: Active) -> None:
    host = state.fault_host
    if isinstance(host, FaultHost) and not host.closed and state.catalogue.get(kind) is fault:
        host.spawn(_clear(state, host, kind, expired=True), f"{state.device.id}-{kind}-expiry")


async def _clear(
    state: DeviceState, host: FaultHost, kind: str, *, expired: bool = False
) -> device_pb2.FaultState:
    fault = state.catalogue.pop(kind)
    if fault.timer is not None:
        fault.timer.cancel()
    try:
        await EFFECTS[kind].undo(state, fault, host)
    finally:
        state.log.warning("fault cleared", kind=kind, expired=expired)
        state.publish("fault-cleared", fault=kind, expired=expired, since_ns=fault.since_ns)
    out: device_pb2.FaultState = fault.proto(state.device.id)
    out.faulted = False
    return out


async def clear(
    caller: DeviceState, request: device_pb2.ClearDeviceFaultRequest
) -> device_pb2.FaultState:
    if not request.kind:
        raise InvalidArgumentError("kind is required", field="kind")
    target, host = _target(caller, request.device)
    if request.kind == DEVICE_DOWN and DEVICE_DOWN not in target.catalogue and target.fault.faulted:
        await target.set_fault(False, "")
        return device_pb2.FaultState(
            faulted=False, kind=DEVICE_DOWN, device=target.device.id, since_ns=target.fault.since_ns
        )
    if request.kind not in target.catalogue:
        active = ", ".join(target.catalogue) or "none"
        raise NotFoundError(
            f"{target.device.id} has no {quote(request.kind)} fault; active: {active}",
            field="kind",
            subject=target.device.id,
            reason="FAULT_NOT_FOUND",
        )
    return await _clear(target, host, request.kind)


def forget(state: DeviceState, kind: str) -> None:
    """Drop a fault whose effect was undone by other means (SetFaultState(faulted=false)
    ends a device-down injected with a duration)."""
    fault = state.catalogue.pop(kind, None)
    if fault is not None and fault.timer is not None:
        fault.timer.cancel()


def listed(state: DeviceState) -> list[device_pb2.FaultState]:
    """A device's faults: device-down (SetFaultState) and the catalogue's."""
    out = [f.proto(state.device.id) for f in state.catalogue.values()]
    if state.fault.faulted and DEVICE_DOWN not in state.catalogue:
        out.insert(
            0,
            device_pb2.FaultState(
                faulted=True,
                kind=DEVICE_DOWN,
                reason=state.fault.reason,
                since_ns=state.fault.since_ns,
                device=state.device.id,
            ),
        )
    return out


def list_faults(
    caller: DeviceState, request: device_pb2.ListDeviceFaultsRequest
) -> device_pb2.DeviceFaultList:
    host = caller.fault_host
    states = (
        list(host.states.values()) if request.process and isinstance(host, FaultHost) else [caller]
    )
    return device_pb2.DeviceFaultList(
        faults=[f for s in states for f in listed(s)], hosted=[s.device.id for s in states]
    )
