"""The catalogue's device faults, as a device shows them: one effect per kind, registered by name.

- crash: the device's server is stopped and its port freed (clients get UNAVAILABLE, connection
  refused); in-process callers get the same UNAVAILABLE (reason PEER_UNREACHABLE). It comes back
  when the fault clears: a new server on the same address, empty of volatile state (inbox,
  queued kernels) and, with `wipe` (the default), of its memory too.
- hang, slow, thermal-throttle, intermittent-hang: alive but degraded (gray.py). The fault
  methods of the Device service still answer a hung device (a BMC).
- hbm-ecc: a region or address range is poisoned: reads and atomics touching it fail DATA_LOSS;
  a write over poisoned bytes heals them; clearing the fault scrubs what is left. The device's
  liveness reports it (`ecc`) while any byte stays poisoned: the manager takes it out of service
  (isolate, replace its jobs) and returns it once repaired.
- sdc: silent data corruption of a region or address range: reads succeed with its bits
  flipped (`mask`), and the device neither refuses nor counts them; checksums above it (EMS)
  find it. Clearing it (the part replaced) makes reads right again.
- die-down: one NPU die fails: kernels on it and UB accesses to its HBM half are UNAVAILABLE,
  its health name "<npu>.d<die>" turns NOT_SERVING while the server stays SERVING (degraded).
- pool-loss: a memory pool crashes with its contents lost (EMS re-replicates what it held).
- device-down: NOT_SERVING, UB and compute refused (SetFaultState, with a duration here).
- broker-outage: this device's process's event publisher lets go and buffers until it clears.
- service-down: a service of this device's process is stopped or hung (servicefaults.py).
- ssd-loss: the SSD tier of the EMS this device's process hosts fails (servicefaults.py).
- clock-skew: the clock of the device's process (its host) reads wrong by a step and a drift
  (clockskew.py): its stamps are off, and what it keeps as instants ends early or late.

The data path (issue 20): an NPU's crash, hang, die-down, device-down and compute slowdown are
carried to the collectives it is a rank of, as a fabric fault of kind rank-down, rank-hung or
rank-slow set with the fault and cleared with it: a serving step or training step with a dead
rank fails at once, with a hung one waits until its deadline, with a slow one runs at the slow
rank's pace, whatever a controller does.

A crashed device's server is gone, so its faults are injected, listed and cleared through any
device of the same process (`Siblings`). A fault may carry a duration (emulated seconds): the
device's process clears it itself when it ends, on the emulated clock. Every injection and
clearance is an event `fault` / `fault-cleared` on the device's topic.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.device.clockskew import ClockSkew
from cmemu.emulator.engines.device.faultbase import (
    ALL,
    ActiveFault,
    Effect,
    clear_rank_fault,
    rank_fault,
)
from cmemu.emulator.engines.device.gray import HANG, IntermittentHang, Slow
from cmemu.emulator.engines.device.servicefaults import KIND as SERVICE_DOWN
from cmemu.emulator.engines.device.servicefaults import ServiceControl, ServiceDown, SsdLoss
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    quote,
)
from cmemu.emulator.model.faults.catalogue import (
    DEVICE_PARAMS,
    CrashParams,
    HbmEccParams,
    SdcParams,
)
from cmemu.emulator.model.faults.params import params_from
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

log = structlog.get_logger("cmemu.faults")

DEVICE_DOWN = "device-down"  # the older fault (SetFaultState), listed and cleared here too
CRASHES = ("crash", "pool-loss")  # kinds whose device has no server while they last


def _wipe(engine: DeviceEngine) -> None:
    """A reset: regions, contents and poison gone."""
    memory = engine.memory
    for region in memory.allocator.regions():
        memory.free(region.region_id)
    engine.effects.poison.clear()


@dataclass(frozen=True)
class Crash:
    on: frozenset[DeviceKind] = ALL
    wipe_always: bool = False  # pool-loss: the contents are always lost

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        already = engine.effects.crashed  # a pool lost while its node is powered off
        await rank_fault(engine, fault, "rank-down")
        engine.effects.crashed = True
        engine.bus.drop_volatile()
        engine.dies.drop_queued()
        if self.wipe_always or (isinstance(fault.params, CrashParams) and fault.params.wipe):
            _wipe(engine)
        if not already and engine.server is not None:
            await engine.server.set_serving(False)
            engine.publish("health", status="NOT_SERVING")
            await engine.server.stop(deferred=fault.by_itself)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await clear_rank_fault(fault, engine)
        if any(kind in engine.faults.active for kind in CRASHES):
            return  # still down for another reason
        engine.effects.crashed = False
        if engine.server is not None:
            await engine.server.restart()
            await engine.show_health()
        engine.publish("health", status="NOT_SERVING" if engine.fault.faulted else "SERVING")


def _fault_range(engine: DeviceEngine, params: HbmEccParams | SdcParams) -> tuple[int, int]:
    """The bytes an hbm-ecc or sdc fault names: a region's, or offset/size."""
    if params.region:
        for region in engine.memory.allocator.regions():
            if region.region_id == params.region:
                return region.offset, region.end
        raise NotFoundError(
            f"{engine.device.id} has no region {params.region}",
            field="params.region",
            subject=str(params.region),
            reason="REGION_NOT_FOUND",
        )
    end = params.offset + params.size
    if end > engine.memory.capacity:
        raise OutOfRangeError(
            f"[{params.offset}, {end}) is outside {engine.device.id}'s"
            f" {engine.memory.capacity} bytes",
            field="params.offset",
            subject=engine.device.id,
        )
    return params.offset, end


@dataclass(frozen=True)
class HbmEcc:
    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        start, end = _fault_range(engine, fault.params)
        fault.params = HbmEccParams(offset=start, size=end - start)  # what stays poisoned
        engine.effects.poison.add(start, end)
        engine.health_moved()  # its process's liveness reports it at once (a RAS event)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        engine.effects.poison.heal(fault.params.offset, fault.params.size)
        engine.health_moved()


@dataclass(frozen=True)
class Sdc:
    """Silent data corruption: reads of the range succeed with flipped bits (memory.py
    Corruption); nothing at the device counts or reports it."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        start, end = _fault_range(engine, fault.params)
        fault.params = SdcParams(offset=start, size=end - start, mask=fault.params.mask)
        engine.effects.corruption.add(start, end)
        engine.effects.corruption.mask = fault.params.mask

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        engine.effects.corruption.clear()


@dataclass(frozen=True)
class DieDown:
    on: frozenset[DeviceKind] = frozenset({DeviceKind.NPU})

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        die = fault.params.die
        if die >= engine.dies.count:
            raise InvalidArgumentError(
                f"die-down: {engine.device.id} has dies 0 to {engine.dies.count - 1}, not {die}",
                field="params.die",
                subject=engine.device.id,
                reason="INVALID_FAULT_PARAM",
            )
        await rank_fault(engine, fault, "rank-down", die=die)
        engine.effects.dies_down.add(die)
        await _die_health(engine, die, serving=False)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        die = fault.params.die
        engine.effects.dies_down.discard(die)
        await clear_rank_fault(fault, engine)
        await _die_health(engine, die, serving=True)


async def _die_health(engine: DeviceEngine, die: int, *, serving: bool) -> None:
    from cmemu.emulator.engines.device.engine import die_name

    up = serving and not engine.fault.faulted
    name = die_name(engine.device.id, die)
    if engine.server is not None:
        await engine.server.set_part(name, up)
    engine.publish("health", service=name, status="SERVING" if up else "NOT_SERVING")


@dataclass(frozen=True)
class DeviceDown:
    """The older fault (SetFaultState) with a duration: NOT_SERVING, UB and compute refused."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        if engine.fault.faulted:
            raise PreconditionError(
                f"{engine.device.id} is down already; clear it first",
                field="kind",
                subject=engine.device.id,
                reason="FAULT_ALREADY_ACTIVE",
            )
        await engine.set_fault(True, fault.params.reason, announce=False)
        await rank_fault(engine, fault, "rank-down")

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await clear_rank_fault(fault, engine)
        await engine.set_fault(False, "", announce=False)


@dataclass(frozen=True)
class BrokerOutage:
    """The broker unreachable from this device's process: its event publisher lets go and
    buffers (emulator/runtime/events.py EventBus.hold) until the fault clears."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        hold = getattr(engine.events, "hold", None)
        if hold is None:
            raise PreconditionError(
                f"{engine.device.id}'s process publishes no events (no MQTT broker)",
                subject=engine.device.id,
                reason="NO_BROKER",
            )
        for sibling in engine.faults.siblings.values():  # one publisher per process
            if sibling is not engine and "broker-outage" in sibling.faults.active:
                raise PreconditionError(
                    f"this process's broker outage is on {sibling.device.id} already",
                    subject=sibling.device.id,
                    reason="FAULT_ALREADY_ACTIVE",
                )
        hold(True)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        hold = getattr(engine.events, "hold", None)
        if hold is not None:
            hold(False)


EFFECTS: dict[str, Effect] = {
    DEVICE_DOWN: DeviceDown(),
    "broker-outage": BrokerOutage(),
    "crash": Crash(),
    "hang": HANG,
    "slow": Slow(),
    "thermal-throttle": Slow(on=frozenset({DeviceKind.NPU})),
    "intermittent-hang": IntermittentHang(),
    "hbm-ecc": HbmEcc(),
    "sdc": Sdc(),
    "die-down": DieDown(),
    "pool-loss": Crash(on=frozenset({DeviceKind.MEMPOOL}), wipe_always=True),
    SERVICE_DOWN: ServiceDown(),
    "ssd-loss": SsdLoss(),
    "clock-skew": ClockSkew(),
}
"""Every kind a device applies itself, by name."""


def _duration(for_s: float) -> float:
    if not math.isfinite(for_s) or for_s < 0:
        raise InvalidArgumentError(
            f"for_s must be finite and >= 0 (0: until cleared), got {for_s}", field="for_s"
        )
    return for_s


@dataclass
class Siblings:
    """The device engines of one process: a crashed device's faults go through any of them."""

    engines: dict[str, DeviceEngine] = field(default_factory=dict)
    closed: bool = False
    services: ServiceControl | None = None  # the process's services, for service-down

    def values(self) -> list[DeviceEngine]:
        return list(self.engines.values())


class DeviceFaults:
    """One device's active faults, and the operations behind Device/InjectFault, ClearFault and
    ListFaults (`target` resolves the device a request names: itself or a sibling)."""

    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine
        self.active: dict[str, ActiveFault] = {}
        self.siblings = Siblings(engines={engine.device.id: engine})

    def target(self, device: str) -> DeviceEngine:
        e = self.engine
        if not device or device == e.device.id:
            return e
        e.topology.device(device)  # NotFoundError for a device that does not exist
        target = self.siblings.engines.get(device)
        if target is None:
            raise PreconditionError(
                f"{device} is not hosted in {e.device.id}'s process: ask one of its siblings",
                field="device",
                subject=device,
                reason="NOT_IN_PROCESS",
            )
        return target

    async def inject(
        self, kind: str, params: object | None, for_s: float, *, by_itself: bool
    ) -> ActiveFault:
        """Apply a `kind` fault; `params` typed (the wire unpacks and checks them:
        emulator/client/wire/faultparams.py), or None for the kind's defaults."""
        e = self.engine
        effect = EFFECTS.get(kind)
        if effect is None:
            raise InvalidArgumentError(
                f"{quote(kind)} is no device fault kind; known: {', '.join(EFFECTS)}",
                field="kind",
                subject=kind,
                reason="UNKNOWN_FAULT_KIND",
            )
        device = e.device
        if device.kind not in effect.on:
            on = ", ".join(sorted(k.value for k in effect.on))
            raise PreconditionError(
                f"{kind} applies to {on}; {device.id} is a {device.kind.value}",
                field="device",
                subject=device.id,
                reason="WRONG_DEVICE_KIND",
            )
        if params is None:
            params = params_from(DEVICE_PARAMS[kind], {}, kind=kind)
        elif not isinstance(params, DEVICE_PARAMS[kind]):
            raise InvalidArgumentError(
                f"{kind} takes {DEVICE_PARAMS[kind].__name__}, not {type(params).__name__}",
                field="params",
                subject=kind,
                reason="WRONG_FAULT_PARAMS",
            )
        for_s = _duration(for_s)
        if kind in self.active:
            raise PreconditionError(
                f"{device.id} already has a {kind} fault; clear it first",
                field="kind",
                subject=device.id,
                reason="FAULT_ALREADY_ACTIVE",
            )
        now = e.clock.now_ns()
        fault = ActiveFault(
            kind=kind,
            params=params,
            since_ns=now,
            for_s=for_s,
            until_ns=now + round(for_s * 1e9) if for_s else 0,
            by_itself=by_itself,
        )
        self.active[kind] = fault  # held before applying: a second injection is refused
        try:
            await effect.apply(e, fault)
        except BaseException:
            del self.active[kind]
            raise
        e.health_moved()
        if for_s:
            fault.expiry = asyncio.get_running_loop().create_task(
                self._expire(kind, fault), name=f"{device.id}-{kind}-expiry"
            )
        e.log.warning("fault", kind=kind, params=fault.params_text, for_s=for_s)
        e.publish("fault", fault=kind, params=fault.params_text, until_ns=fault.until_ns)
        return fault

    async def _expire(self, kind: str, fault: ActiveFault) -> None:
        await self.engine.clock.sleep_until(fault.until_ns)
        if self.siblings.closed or self.active.get(kind) is not fault:
            return
        fault.expiry = None  # this task is the expiry: not cancelled by the clear below
        try:
            await self._clear(kind, expired=True)
        except EmulatorError as exc:
            log.error("fault expiry failed", device=self.engine.device.id, error=str(exc))

    async def _clear(self, kind: str, *, expired: bool = False) -> ActiveFault:
        e = self.engine
        fault = self.active.pop(kind)
        if fault.expiry is not None:
            fault.expiry.cancel()
        try:
            await EFFECTS[kind].undo(e, fault)
            e.health_moved()
        finally:
            e.log.warning("fault cleared", kind=kind, expired=expired)
            e.publish("fault-cleared", fault=kind, expired=expired, since_ns=fault.since_ns)
        return fault

    async def clear(self, kind: str) -> ActiveFault | None:
        """Clear this device's `kind` fault; None for a device-down set by SetFaultState."""
        e = self.engine
        if not kind:
            raise InvalidArgumentError("kind is required", field="kind")
        if kind == DEVICE_DOWN and DEVICE_DOWN not in self.active and e.fault.faulted:
            await e.set_fault(False, "")
            return None
        if kind not in self.active:
            active = ", ".join(self.active) or "none"
            raise NotFoundError(
                f"{e.device.id} has no {quote(kind)} fault; active: {active}",
                field="kind",
                subject=e.device.id,
                reason="FAULT_NOT_FOUND",
            )
        return await self._clear(kind)

    def forget(self, kind: str) -> None:
        """Drop a fault whose effect was undone by other means (SetFaultState(faulted=false)
        ends a device-down injected with a duration)."""
        fault = self.active.pop(kind, None)
        if fault is not None and fault.expiry is not None:
            fault.expiry.cancel()

    def listed(self) -> list[ActiveFault]:
        """This device's faults: device-down (SetFaultState) and the catalogue's."""
        e = self.engine
        out = list(self.active.values())
        if e.fault.faulted and DEVICE_DOWN not in self.active:
            out.insert(
                0,
                ActiveFault(
                    kind=DEVICE_DOWN, params=None, since_ns=e.fault.since_ns, reason=e.fault.reason
                ),
            )
        return out


def join(engines: Mapping[str, DeviceEngine]) -> Siblings:
    """Make the engines of one process siblings of each other (a crashed one's faults go
    through any other)."""
    siblings = Siblings(engines=dict(engines))
    for engine in engines.values():
        engine.faults.siblings = siblings
    return siblings


def close(siblings: Siblings) -> None:
    """End every duration timer (the process stops)."""
    siblings.closed = True
    for engine in siblings.values():
        for fault in engine.faults.active.values():
            for task in (fault.expiry, fault.cycle):
                if task is not None:
                    task.cancel()
