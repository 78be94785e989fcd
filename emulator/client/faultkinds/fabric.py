"""The fabric's kinds: link-down, link-degraded, link-latency, switch-down, partition, link-flap,
link-loss (frames lost or failing CRC, resent: the link's goodput and latency pay for it) and
optical-module (the bundle of uplinks one module of an L1 chip carries, down as one fault) and
l1-board (a node's L1 chips and all their links: the node cut off the unified bus).
The fabric applies them to its link graph (emulator/model/linkfaults.py) and owns their timers
(a flap's period, a duration), in emulated time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import CALL_TIMEOUT_S, ActiveFault, Typed
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.faults.catalogue import (
    LinkDegradedParams,
    LinkFlapParams,
    LinkLatencyParams,
    LinkLossParams,
    NoParams,
    OpticalModuleParams,
    PartitionParams,
)
from cmemu.v1 import fabric_pb2


def fabric_detail(f: fabric_pb2.FabricFault) -> str:
    p: dict[str, Any] = faultparams.raw_params(f)
    parts = []
    if p.get("factor"):
        parts.append(f"factor={p['factor']:g}")
    if p.get("latency_us"):
        parts.append(f"latency=+{p['latency_us']:g}us")
    if p.get("rate"):
        parts.append(f"rate={p['rate']:g}")
    if "module" in p:
        parts.append(f"module={p['module']}")
    if p.get("period_s"):
        parts.append(f"period={p['period_s']:g}s duty={p.get('duty', 0.0):g}")
    if p.get("side_a") or p.get("side_b"):
        parts.append(f"side_a={p.get('side_a', '')} side_b={p.get('side_b', '')}")
        if p.get("one_way"):
            parts.append("one-way (side_a to side_b lost)")
    if f.until_ns:
        parts.append(f"until={f.until_ns / 1e9:.3f}s")
    return " ".join(parts)


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
    target: str = "a link 'a~b' (cmemu links)"

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


LINK_DOWN = FabricKind(name="link-down", help="a link carries nothing", params=NoParams)
LINK_DEGRADED = FabricKind(
    name="link-degraded", help="a link keeps a share of its bandwidth", params=LinkDegradedParams
)
LINK_LATENCY = FabricKind(
    name="link-latency", help="a link adds latency per crossing", params=LinkLatencyParams
)
SWITCH_DOWN = FabricKind(
    name="switch-down",
    help="every link of a switch is down",
    params=NoParams,
    target="a switch id (e.g. l2-p0-s3)",
)
PARTITION = FabricKind(
    name="partition",
    help="devices of side_a cannot reach those of side_b",
    params=PartitionParams,
    target="none (the sides are params)",
)
LINK_FLAP = FabricKind(
    name="link-flap",
    help="a link toggles down and up: down duty*period_s of every period_s (emulated)",
    params=LinkFlapParams,
)
LINK_LOSS = FabricKind(
    name="link-loss",
    help="a link loses (or fails CRC on) a share of its frames; resending costs bandwidth",
    params=LinkLossParams,
)
OPTICAL_MODULE = FabricKind(
    name="optical-module",
    help="an optical module of an L1 chip fails: the uplinks it carries go down at once",
    params=OpticalModuleParams,
    target="an L1 chip id (e.g. n03-l1s4)",
)
L1_BOARD = FabricKind(
    name="l1-board",
    help="a node's L1 switch board fails: its L1 chips and all their links go down at once "
    "(its devices stay up, cut off the unified bus, each other included)",
    params=NoParams,
    target="a node id (e.g. n03)",
)
