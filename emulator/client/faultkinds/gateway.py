"""The client's side of the RDMA plane's kinds: rdma-link-down, rdma-link-slow,
rdma-switch-down, rdma-switch-slow and supernode-partition (two supernodes cannot reach each
other over the plane), held by the plane's timing authority, the sn0 gateway, whichever gateway
is asked; and gateway-down (a gateway refuses RDMA and reports NOT_SERVING). Each one's whole
story is its module of emulator/model/faults/gateway/ (params, help, target, its name here and
on the gateway's API, its effect), and its record here is made from that module's KIND
(`GatewayKind.of`). Each gateway owns their timers, in emulated time. Their ids are the
gateway's, prefixed `rdma:` (`rdma:r3`, `rdma:sn1-gw-down`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import CALL_TIMEOUT_S, ActiveFault, Typed, not_found
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.faults import gateway as plane
from cmemu.emulator.model.faults.gateway.base import LINK
from cmemu.emulator.model.faults.gateway.gateway_down import NAME as GATEWAY_DOWN
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.v1 import gateway_pb2

DOWN_SUFFIX = "-down"  # a gateway's own fault: "<gateway>-down"


def catalogue_name(wire: str) -> str:
    """A gateway kind's name in the catalogue, from its name on the gateway's API (an unknown
    one, from a newer gateway, as `rdma-<name>`)."""
    kind = plane.KINDS.get(wire)
    return f"rdma-{wire}" if kind is None else kind.catalogue


def gateway_fault(f: gateway_pb2.GatewayFault) -> ActiveFault:
    detail = []
    factor = faultparams.raw_params(f).get("factor")
    if factor:
        detail.append(f"factor={factor:g}")
    if f.until_ns:
        detail.append(f"until={f.until_ns / 1e9:.3f}s")
    return ActiveFault(
        id=str(FaultId.rdma(f.id)),
        kind=catalogue_name(f.kind),
        target=f.target,
        detail=" ".join(detail),
        since_ns=f.since_ns,
        until_ns=f.until_ns,
    )


@dataclass(frozen=True, kw_only=True)
class GatewayKind(Typed):
    """A fault a gateway takes: the client's side of one of emulator/model/faults/gateway/
    (`of` makes it from that module's record)."""

    wire: str  # the kind's name on the gateway's API
    target: str = LINK

    @classmethod
    def of(cls, kind: plane.Kind[Any]) -> GatewayKind:
        """The client's record of a gateway kind, from the kind's own module."""
        return cls(
            name=kind.catalogue,
            wire=kind.name,
            help=kind.help,
            params=kind.params,
            target=kind.target,
        )

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        gateway = clients.gateway(target if self.wire == GATEWAY_DOWN else None)
        fault = faultparams.pack(
            gateway_pb2.GatewayFault(kind=self.wire, target=target, for_s=duration_s or 0.0),
            self.wire,
            typed,
        )
        stored = await reply_of(None, gateway.InjectFault(fault, timeout=CALL_TIMEOUT_S))
        return gateway_fault(stored)


KINDS = tuple(GatewayKind.of(kind) for kind in plane.KINDS.values())
"""Every gateway kind, in the gateway's order, by its catalogue name."""


async def listed(clients: Clients) -> list[ActiveFault]:
    """Every gateway's own fault and the plane's (none without a plane); a gateway that does
    not answer is left out (its health shows why)."""
    plane = clients.topology.scaleout
    if plane is None:
        return []
    replies = await asyncio.gather(
        *(
            clients.gateway(i).ListFaults(
                gateway_pb2.ListGatewayFaultsRequest(), timeout=CALL_TIMEOUT_S
            )
            for i in range(len(plane.gateways))
        ),
        return_exceptions=True,
    )
    found: dict[str, ActiveFault] = {}
    for reply in replies:
        if isinstance(reply, gateway_pb2.GatewayFaultList):
            for f in reply.faults:
                found.setdefault(str(FaultId.rdma(f.id)), gateway_fault(f))
    return list(found.values())


async def clear(clients: Clients, fault_id: FaultId) -> None:
    """Clear a fault by its `rdma:` id, at the gateway that holds it."""
    own = fault_id.subject
    which = own.removesuffix(DOWN_SUFFIX) if own.endswith(DOWN_SUFFIX) else None
    gateway = clients.gateway(which)
    request = gateway_pb2.ClearGatewayFaultRequest(id=own)
    try:
        await reply_of(None, gateway.ClearFault(request, timeout=CALL_TIMEOUT_S))
    except NotFoundError:
        raise not_found(fault_id) from None
