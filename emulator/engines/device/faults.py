"""A device's faults: inject, expire, clear and list the kinds of kinds/ (one module per kind,
registered in kinds/__init__.py KINDS, each holding its params, help and effect).

A crashed device's server is gone, so its faults are injected, listed and cleared through any
device of the same process (`Siblings`). A fault may carry a duration (emulated seconds): the
device's process clears it itself when it ends, on the emulated clock. Every injection and
clearance is an event `fault` / `fault-cleared` on the device's topic.

The data path (issue 20): an NPU's crash, hang, die-down, device-down and compute slowdown are
carried to the collectives it is a rank of, as a fabric fault of kind rank-down, rank-hung or
rank-slow set with the fault and cleared with it (faultbase.py rank_fault): a serving step or
training step with a dead rank fails at once, with a hung one waits until its deadline, with a
slow one runs at the slow rank's pace, whatever a controller does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.device.faultbase import ActiveFault
from cmemu.emulator.engines.device.kinds import KINDS, kind_of
from cmemu.emulator.engines.device.kinds.device_down import NAME as DEVICE_DOWN
from cmemu.emulator.engines.device.kinds.service_down import ServiceControl
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    quote,
)
from cmemu.emulator.model.faults.params import params_from

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

log = structlog.get_logger("cmemu.faults")

__all__ = ["DEVICE_DOWN", "DeviceFaults", "Siblings", "close", "join"]


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
        spec = kind_of(kind)
        device = e.device
        if device.kind not in spec.on:
            on = ", ".join(sorted(k.value for k in spec.on))
            raise PreconditionError(
                f"{kind} applies to {on}; {device.id} is a {device.kind.value}",
                field="device",
                subject=device.id,
                reason="WRONG_DEVICE_KIND",
            )
        if params is None:
            params = params_from(spec.params, {}, kind=kind)
        elif not isinstance(params, spec.params):
            raise InvalidArgumentError(
                f"{kind} takes {spec.params.__name__}, not {type(params).__name__}",
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
            await spec.effect.apply(e, fault)
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
            await KINDS[kind].effect.undo(e, fault)
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
