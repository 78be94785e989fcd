"""Faults of a running emulator, device and fabric alike, through its public gRPC APIs.

Fault kinds are registered by name in one table, KINDS (as Toxiproxy registers its toxics): the
fabric's link and switch kinds go to cmemu.v1.Fabric/InjectFault; `device-down` goes to
cmemu.v1.Device/SetFaultState on the device. What every kind shares (the required options,
listing and removal) lives here, never in a kind. `cmemu fault` is a skin over this module.

A device fault's id is `dev:<device id>` (one device holds at most one fault); fabric faults keep
the ids the fabric gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cmemu.v1 import device_pb2, fabric_pb2
from emulator.client.clients import Clients
from emulator.model.errors import InvalidArgumentError, NotFoundError

DEVICE_FAULT_PREFIX = "dev:"
DEFAULT_REASON = "cmemu fault add"
CONCURRENCY = 64


def device_fault_id(device_id: str) -> str:
    return f"{DEVICE_FAULT_PREFIX}{device_id}"


def device_of_fault(fault_id: str) -> str | None:
    """The device a `dev:` fault id names, or None for a fabric fault id."""
    prefix, sep, device = fault_id.partition(":")
    return device if sep and f"{prefix}:" == DEVICE_FAULT_PREFIX else None


@dataclass(frozen=True, kw_only=True)
class FaultOptions:
    """What `cmemu fault add` was given, typed: no argparse below this line."""

    target: str = ""
    factor: float | None = None
    latency_us: float | None = None
    side_a: tuple[str, ...] = ()
    side_b: tuple[str, ...] = ()
    reason: str = DEFAULT_REASON


@dataclass(frozen=True, kw_only=True)
class ActiveFault:
    id: str
    kind: str
    target: str
    detail: str = ""


class Kind(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    @property
    def requires(self) -> tuple[str, ...]: ...

    async def add(self, clients: Clients, opts: FaultOptions) -> ActiveFault: ...


# --- the kinds ---------------------------------------------------------------------------------


def _fabric_detail(f: fabric_pb2.FabricFault) -> str:
    parts = []
    if f.factor:
        parts.append(f"factor={f.factor:g}")
    if f.added_latency_us:
        parts.append(f"latency=+{f.added_latency_us:g}us")
    if f.side_a or f.side_b:
        parts.append(f"side_a={','.join(f.side_a)} side_b={','.join(f.side_b)}")
    return " ".join(parts)


def _fabric_fault(f: fabric_pb2.FabricFault) -> ActiveFault:
    return ActiveFault(id=f.id, kind=f.kind, target=f.target, detail=_fabric_detail(f))


@dataclass(frozen=True, kw_only=True)
class FabricKind:
    """A fault the fabric applies to its link graph (emulator/model/linkfaults.py)."""

    name: str
    help: str
    requires: tuple[str, ...] = ("target",)

    async def add(self, clients: Clients, opts: FaultOptions) -> ActiveFault:
        stored = await clients.fabric().InjectFault(
            fabric_pb2.FabricFault(
                kind=self.name,
                target=opts.target,
                factor=opts.factor or 0.0,
                added_latency_us=opts.latency_us or 0.0,
                side_a=opts.side_a,
                side_b=opts.side_b,
            )
        )
        return _fabric_fault(stored)


def _device_fault(device_id: str, f: device_pb2.FaultState) -> ActiveFault:
    return ActiveFault(
        id=device_fault_id(device_id),
        kind=DeviceDown.name,
        target=device_id,
        detail=f"reason={f.reason!r} since={f.since_ns / 1e9:.3f}s",
    )


@dataclass(frozen=True, kw_only=True)
class DeviceDown:
    """The device reports NOT_SERVING and answers UB and compute calls with UNAVAILABLE."""

    name: str = "device-down"
    help: str = "a device reports NOT_SERVING and refuses UB and compute calls"
    requires: tuple[str, ...] = ("target",)

    async def add(self, clients: Clients, opts: FaultOptions) -> ActiveFault:
        device = clients.topology.device(opts.target).id
        stored = await clients.device(device).SetFaultState(
            device_pb2.FaultState(faulted=True, reason=opts.reason)
        )
        return _device_fault(device, stored)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        FabricKind(name="link-down", help="a link 'a~b' carries nothing"),
        FabricKind(
            name="link-degraded",
            help="a link keeps --factor of its bandwidth",
            requires=("target", "factor"),
        ),
        FabricKind(
            name="link-latency",
            help="a link adds --latency-us per crossing",
            requires=("target", "latency_us"),
        ),
        FabricKind(name="switch-down", help="every link of a switch (e.g. l2-p0-s3) is down"),
        FabricKind(
            name="partition",
            help="devices of --side-a cannot reach those of --side-b",
            requires=("side_a", "side_b"),
        ),
        DeviceDown(),
    )
}
OPTION_OF = {
    "target": "TARGET",
    "factor": "--factor",
    "latency_us": "--latency-us",
    "side_a": "--side-a",
    "side_b": "--side-b",
}


# --- operations, typed -------------------------------------------------------------------------


async def add(clients: Clients, kind_name: str, opts: FaultOptions) -> ActiveFault:
    kind = KINDS[kind_name]
    missing = missing_options(kind_name, opts)
    if missing:
        raise InvalidArgumentError(
            f"fault kind {kind.name} needs {' and '.join(missing)}", field=missing[0]
        )
    return await kind.add(clients, opts)


def missing_options(kind_name: str, opts: FaultOptions) -> list[str]:
    """The options a kind requires that `opts` leaves empty, as the CLI spells them."""
    return [OPTION_OF[o] for o in KINDS[kind_name].requires if not getattr(opts, o)]


async def _gather_limited(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with limit:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)


async def device_faults(clients: Clients) -> list[ActiveFault]:
    """Every device that reports itself faulted; unreachable devices are left out (status and
    ls show their health)."""
    devices = clients.topology.devices

    def ask(device_id: str) -> Callable[[], Awaitable[device_pb2.FaultState]]:
        return lambda: clients.device(device_id).GetFaultState(
            device_pb2.GetFaultStateRequest(), timeout=5.0
        )

    replies = await _gather_limited([ask(d.id) for d in devices])
    return [
        _device_fault(d.id, r)
        for d, r in zip(devices, replies, strict=True)
        if isinstance(r, device_pb2.FaultState) and r.faulted
    ]


async def fabric_faults(clients: Clients) -> list[ActiveFault]:
    listed = await clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest(), timeout=5.0)
    return [_fabric_fault(f) for f in listed.faults]


async def list_all(clients: Clients) -> list[ActiveFault]:
    fabric, devices = await asyncio.gather(fabric_faults(clients), device_faults(clients))
    return [*fabric, *devices]


async def remove(clients: Clients, fault_id: str) -> None:
    device = device_of_fault(fault_id)
    if device is None:
        await clients.fabric().ClearFault(fabric_pb2.ClearFaultRequest(id=fault_id))
        return
    stub = clients.device(clients.topology.device(device).id)
    if not (await stub.GetFaultState(device_pb2.GetFaultStateRequest())).faulted:
        raise NotFoundError(f"no fault {fault_id!r}: device {device} is not faulted")
    await stub.SetFaultState(device_pb2.FaultState(faulted=False))


async def remove_all(clients: Clients) -> list[ActiveFault]:
    """Clear every fabric fault and every faulted device; what was cleared."""
    cleared = await list_all(clients)
    if any(device_of_fault(f.id) is None for f in cleared):
        await clients.fabric().ClearFault(fabric_pb2.ClearFaultRequest(all=True))
    await asyncio.gather(
        *(remove(clients, f.id) for f in cleared if device_of_fault(f.id) is not None)
    )
    return cleared
