"""The client's side of the fabric's kinds (link-down, link-degraded, link-latency, switch-down,
partition, link-flap, link-loss, optical-module, l1-board): each one's whole story is its module
of emulator/model/faults/fabric/ (params, checks, help, target, its effect on the link graph),
and its record here is made from that module's KIND (`FabricKind.of`). The fabric applies them
to its link graph and owns their timers (a flap's period, a duration), in emulated time; the
kinds the fabric takes only from a device's own fault (ports-degraded, rank-*) are none of the
user's catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import CALL_TIMEOUT_S, ActiveFault, Typed
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.faults import fabric
from cmemu.emulator.model.faults.fabric.base import LINK
from cmemu.v1 import fabric_pb2


def fabric_detail(f: fabric_pb2.FabricFault) -> str:
    """`cmemu fault ls`'s detail of a fabric fault: its params as its kind's module describes
    them (emulator/model/faults/fabric/), and when it ends."""
    kind = fabric.KINDS.get(f.kind)
    params = faultparams.unpack(f, fabric.PARAMS)
    parts = [kind.describe(params)] if kind is not None and params is not None else []
    if f.until_ns:
        parts.append(f"until={f.until_ns / 1e9:.3f}s")
    return " ".join(part for part in parts if part)


def fabric_fault(f: fabric_pb2.FabricFault) -> ActiveFault:
    return ActiveFault(
        id=f.id,
        kind=f.kind,
        target=f.target,
        detail=fabric_detail(f),
        since_ns=f.since_ns,
        until_ns=f.until_ns,
    )


@dataclass(frozen=True, kw_only=True)
class FabricKind(Typed):
    """A fault the fabric applies to its link graph: the client's side of one of
    emulator/model/faults/fabric/ (`of` makes it from that module's record)."""

    target: str = LINK

    @classmethod
    def of(cls, kind: fabric.Kind[Any]) -> FabricKind:
        """The client's record of a fabric kind, from the kind's own module."""
        return cls(name=kind.name, help=kind.help, params=kind.params, target=kind.target)

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        fault = faultparams.pack(
            fabric_pb2.FabricFault(kind=self.name, target=target, for_s=duration_s or 0.0),
            self.name,
            typed,
        )
        stored = await reply_of(None, clients.fabric().InjectFault(fault, timeout=CALL_TIMEOUT_S))
        return fabric_fault(stored)


KINDS: dict[str, FabricKind] = {
    name: FabricKind.of(kind) for name, kind in fabric.KINDS.items() if not kind.from_device
}
"""The fabric's kinds a user adds, by name, in the fabric's order (the catalogue,
emulator/client/faults.py, places each)."""
