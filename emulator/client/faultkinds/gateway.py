"""The RDMA plane's kinds: rdma-link-down, rdma-link-slow, rdma-switch-down, rdma-switch-slow
and supernode-partition (two supernodes cannot reach each other over the plane), held by the
plane's timing authority, the sn0 gateway, whichever gateway is asked; and gateway-down (a
gateway refuses RDMA and reports NOT_SERVING). Each gateway owns their timers, in emulated
time. Their ids are the gateway's, prefixed `rdma:` (`rdma:r3`, `rdma:sn1-gw-down`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import CALL_TIMEOUT_S, ActiveFault, Typed, not_found
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.faults.catalogue import LinkDegradedParams, NoParams
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.v1 import gateway_pb2

DOWN_SUFFIX = "-down"  # a gateway's own fault: "<gateway>-down"
OWN_NAMES = {"gateway-down": "gateway-down", "partition": "supernode-partition"}  # else rdma-


def gateway_fault(f: gateway_pb2.GatewayFault) -> ActiveFault:
    detail = []
    factor = faultparams.raw_params(f).get("factor")
    if factor:
        detail.append(f"factor={factor:g}")
    if f.until_ns:
        detail.append(f"until={f.until_ns / 1e9:.3f}s")
    return ActiveFault(
        id=str(FaultId.rdma(f.id)),
        kind=OWN_NAMES.get(f.kind, f"rdma-{f.kind}"),
        target=f.target,
        detail=" ".join(detail),
        since_ns=f.since_ns,
        until_ns=f.until_ns,
    )


@dataclass(frozen=True, kw_only=True)
class GatewayKind(Typed):
    wire: str  # the kind's name on the gateway's API
    target: str = "an RDMA plane link 'a~b' (die~leaf, leaf~spine, spine~core)"

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        gateway = clients.gateway(target if self.wire == "gateway-down" else None)
        fault = faultparams.pack(
            gateway_pb2.GatewayFault(kind=self.wire, target=target, for_s=duration_s or 0.0),
            self.wire,
            typed,
        )
        stored = await reply_of(None, gateway.InjectFault(fault, timeout=CALL_TIMEOUT_S))
        return gateway_fault(stored)


SWITCH = "an RDMA plane switch (n00-leaf, spine3, sn1-spine3, core5)"
RDMA_LINK_DOWN = GatewayKind(
    name="rdma-link-down",
    wire="link-down",
    help="an RDMA plane link carries nothing",
    params=NoParams,
)
RDMA_LINK_SLOW = GatewayKind(
    name="rdma-link-slow",
    wire="link-slow",
    help="an RDMA plane link keeps a share of its rate",
    params=LinkDegradedParams,
)
RDMA_SWITCH_DOWN = GatewayKind(
    name="rdma-switch-down",
    wire="switch-down",
    help="every link of an RDMA plane switch is down",
    params=NoParams,
    target=SWITCH,
)
RDMA_SWITCH_SLOW = GatewayKind(
    name="rdma-switch-slow",
    wire="switch-slow",
    help="every link of an RDMA plane switch keeps a share of its rate",
    params=LinkDegradedParams,
    target=SWITCH,
)
GATEWAY_DOWN = GatewayKind(
    name="gateway-down",
    wire="gateway-down",
    help="a supernode's RDMA gateway refuses RDMA and reports NOT_SERVING",
    params=NoParams,
    target="a gateway id (sn0-gw, sn1-gw)",
)
SUPERNODE_PARTITION = GatewayKind(
    name="supernode-partition",
    wire="partition",
    help="two supernodes' RDMA gateways cannot reach each other: the scale-out plane between "
    "them is cut (each still reaches the others)",
    params=NoParams,
    target="two supernodes 'sn0~sn1'",
)
KINDS = (
    RDMA_LINK_DOWN,
    RDMA_LINK_SLOW,
    RDMA_SWITCH_DOWN,
    RDMA_SWITCH_SLOW,
    GATEWAY_DOWN,
    SUPERNODE_PARTITION,
)


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
