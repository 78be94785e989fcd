"""A gateway's faults: a gateway-down of its own (it refuses its queue pairs' calls and the
bytes landing on its NPUs, and turns NOT_SERVING), and the plane's link and switch faults, which
live with the plane's timing on the authority (sn0's gateway) and are asked of it elsewhere."""

from __future__ import annotations

import dataclasses
from typing import Any

from cmemu.emulator.engines.gateway.state import GatewayState
from cmemu.emulator.engines.gateway.types import GATEWAY_DOWN, PEER_TIMEOUT_S
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    blame,
)
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.rdmafault import RdmaFault


class GatewayFaults(GatewayState):
    """Fault control, which a down gateway still answers."""

    async def inject_fault(self, fault: RdmaFault[Any]) -> RdmaFault[Any]:
        """A fault of the plane (held by the authority) or a gateway-down (by its gateway)."""
        if fault.kind == GATEWAY_DOWN:
            return await self._gateway_down(fault)
        if self.authority is None:  # the plane's faults live with its timing
            return await self.peer(self.authority_id).inject_fault(fault, deadline_s=PEER_TIMEOUT_S)
        fault = dataclasses.replace(fault, since_s=self.now_s(), id="")
        with blame(field="target", on=NotFoundError):
            stored = self.authority.add_fault(fault)
        self.faults_moved()
        self._announce_fault(stored)
        return stored

    async def _gateway_down(self, request: RdmaFault[Any]) -> RdmaFault[Any]:
        target = request.target or self.name
        self.gateway(target, field="target")
        if target != self.name:
            return await self.peer(target).inject_fault(request, deadline_s=PEER_TIMEOUT_S)
        if self.down is not None:
            raise PreconditionError(
                f"{self.name} is down already (fault {self.down.id})",
                subject=self.name,
                reason="FAULT_ACTIVE",
            )
        if not request.for_s >= 0:
            raise InvalidArgumentError("for_s must be >= 0 (0: until cleared)", field="for_s")
        fault = RdmaFault(
            kind=GATEWAY_DOWN,
            params=NoParams(),
            target=self.name,
            for_s=request.for_s,
            since_s=self.now_s(),
            id=f"{self.name}-down",
        )
        await self.set_down(fault)
        self._announce_fault(fault)
        return fault

    def _announce_fault(self, fault: RdmaFault[Any]) -> None:
        self.log.warning("fault injected", fault=fault.id, kind=fault.kind, target=fault.target)
        self.publish(
            "fault-injected",
            fault=fault.id,
            kind=fault.kind,
            target=fault.target,
            until_ns=str(round(fault.until_s * 1e9)),
        )

    async def clear_fault(self, fault_id: str, *, all: bool) -> list[RdmaFault[Any]]:
        """Clear one fault (by id) or every one; the faults left."""
        if fault_id and all:
            raise InvalidArgumentError("name one fault (id) or all, not both", field="all")
        if not fault_id and not all:
            raise InvalidArgumentError(
                "id is required (clearing every fault takes all=true)", field="id"
            )
        own = self.down is not None and (all or fault_id == self.down.id)
        if own:
            await self.set_down(None)
        plane = all or not own
        if plane and self.authority is None:
            await self.peer(self.authority_id).clear_fault(
                fault_id, all=all, deadline_s=PEER_TIMEOUT_S
            )
        elif plane and self.authority is not None:
            self.authority.clear_fault(fault_id, all=all)
            self.faults_moved()
        self.publish("fault-cleared", fault=fault_id or "all")
        self.log.warning("fault cleared", fault=fault_id or "all")
        return await self.list_faults()

    async def list_faults(self) -> list[RdmaFault[Any]]:
        """This gateway's own fault, then the plane's."""
        out = [self.down] if self.down is not None else []
        if self.authority is not None:
            return out + list(self.authority.faults.faults.values())
        plane = await self.peer(self.authority_id).list_faults(deadline_s=PEER_TIMEOUT_S)
        return out + [f for f in plane if f.kind != GATEWAY_DOWN]
