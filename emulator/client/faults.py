"""Faults of a running emulator, device and fabric alike, through its public gRPC APIs.

The fault catalogue is one table, KINDS, of kinds registered by name (as Toxiproxy registers its
toxics), each a small module of emulator/client/faultkinds/ with TYPED parameters: a frozen
dataclass per kind (in the kind's module; a device kind's in emulator/engines/device/kinds/, a
fabric or gateway kind's in emulator/model/faults/fabric/ or gateway/),
built from a dict by
`kind.params_from(raw)` (InvalidArgumentError on an unknown or bad parameter), and
`kind.add(clients, target, params, duration_s) -> ActiveFault`. `clear(clients, fault_id)`
clears any of them by the id `add` returned. Durations are emulated seconds, kept by whoever
owns the fault (the device's process, the fabric), so nothing has to wait client-side.

What every kind shares (ids, reaching a device through a sibling) lives in faultkinds/base.py;
`cmemu fault` is a skin over this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds import (
    broker_outage,
    checkpoint_corrupt,
    container,
    fabric,
    gateway,
    node_power_off,
    process,
    rack_power_off,
    service,
    ssd_loss,
    thermal_throttle,
)
from cmemu.emulator.client.faultkinds.base import (
    ActiveFault,
    DeviceKind,
    Kind,
    clear_device,
    device_fault,
    device_fault_id,
    not_found,
)
from cmemu.emulator.client.faultkinds.container import ContainerControl, attach_engine
from cmemu.emulator.client.faultkinds.process import ProcessTable, attach_processes
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.engines.device.kinds import KINDS as DEVICE_KINDS
from cmemu.emulator.engines.device.kinds import service_down
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.faults.ids import Family, FaultId
from cmemu.emulator.model.faults.params import unknown_kind
from cmemu.emulator.model.naming import LINK, LINK_DIRECTED, parse_id
from cmemu.v1 import device_pb2, fabric_pb2

__all__ = [
    "KINDS",
    "ActiveFault",
    "ContainerControl",
    "Kind",
    "ProcessTable",
    "attach_engine",
    "attach_processes",
    "clear",
    "device_fault_id",
    "inject",
    "kind_of",
    "list_all",
    "remove",
    "remove_all",
]

CONCURRENCY = 64


def _device(name: str) -> DeviceKind:
    """A kind a user adds to one device as is: the client's side of its module,
    emulator/engines/device/kinds/<kind>.py."""
    return DeviceKind.of(DEVICE_KINDS[name])


def _fabric(name: str) -> Kind:
    """A fabric kind a user adds: the client's side of its module,
    emulator/model/faults/fabric/<kind>.py."""
    return fabric.KINDS[name]


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        _device("crash"),
        _device("hang"),
        _device("slow"),
        _device("hbm-ecc"),
        _device("sdc"),
        _device("die-down"),
        _fabric("link-flap"),
        node_power_off.KIND,
        process.KILL,
        process.PAUSE,
        _device("pool-loss"),
        broker_outage.KIND,
        _fabric("link-down"),
        _fabric("link-degraded"),
        _fabric("link-latency"),
        _fabric("switch-down"),
        _fabric("partition"),
        _device("device-down"),
        thermal_throttle.KIND,
        _device("intermittent-hang"),
        _fabric("link-loss"),
        _fabric("optical-module"),
        _fabric("l1-board"),
        rack_power_off.KIND,
        *gateway.KINDS,
        *container.KINDS,
        service.KILL,
        service.HANG,
        service.SLOW,
        service.PARTITION,
        ssd_loss.KIND,
        checkpoint_corrupt.KIND,
        _device("clock-skew"),
    )
}
"""The catalogue, in `cmemu fault kinds` order: every device kind that a user adds to one device
(`one_device`) is here as made from its module, and every fabric and gateway kind a user adds
(emulator/model/faults/fabric/, gateway/) likewise; the others have client kinds of their own."""


def kind_of(name: str) -> Kind:
    kind = KINDS.get(name)
    if kind is None:
        raise unknown_kind(name, sorted(KINDS))
    return kind


async def inject(
    clients: Clients,
    kind_name: str,
    target: str = "",
    params: Mapping[str, object] | Any = None,
    duration_s: float | None = None,
) -> ActiveFault:
    """Add a fault of `kind_name` on `target`; params as a dict (checked here) or typed."""
    kind = kind_of(kind_name)
    typed = (
        kind.params_from(params or {}) if params is None or isinstance(params, Mapping) else params
    )
    if duration_s is not None and not duration_s > 0:
        raise InvalidArgumentError(f"duration must be > 0 s, got {duration_s}", field="for_s")
    if kind.target != "none" and not target and kind.name != "partition":
        raise InvalidArgumentError(
            f"fault kind {kind.name} needs a target: {kind.target}", field="target"
        )
    return await kind.add(of_target(clients, target), target, typed, duration_s)


def of_target(clients: Clients, target: str) -> Clients:
    """The clients of the supernode a fault target belongs to (its fabric, its devices): a
    device, node, switch or service id, or a link named by its ends."""
    if len(clients.supernodes) == 1 or not target:
        return clients
    end = target
    for sep in (LINK, LINK_DIRECTED):
        end = end.split(sep)[0]
    try:
        index = parse_id(end).supernode
    except InvalidArgumentError:
        return clients  # the kind names what is wrong with it
    return clients.supernode(index) if index < len(clients.supernodes) else clients


def every_supernode(clients: Clients) -> list[Clients]:
    return [clients.supernode(i) for i in range(len(clients.supernodes))]


# --- listing -------------------------------------------------------------------------------------


async def _gather_limited(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with limit:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)


async def device_faults(clients: Clients) -> list[ActiveFault]:
    """Every device fault, asked of one device per process (its listing covers the process's
    devices, crashed ones included); devices no one answers for are left out (status and ls
    show their health). Every supernode's."""
    request = device_pb2.ListDeviceFaultsRequest(process=True)
    uncovered = [d.id for t in clients.supernodes for d in t.devices]
    found: dict[str, ActiveFault] = {}

    def ask(device: str) -> Callable[[], Awaitable[device_pb2.DeviceFaultList]]:
        return lambda: reply_of(None, clients.device(device).ListFaults(request, timeout=5.0))

    first = True
    while uncovered:
        batch = uncovered[:1] if first else uncovered[:CONCURRENCY]
        first = False
        replies = await _gather_limited([ask(d) for d in batch])
        covered = set(batch)
        for reply in replies:
            if isinstance(reply, device_pb2.DeviceFaultList):
                covered |= set(reply.hosted)
                for state in reply.faults:
                    carried = state.kind == service_down.NAME  # a control-plane service's
                    fault = service.listed(state, clients) if carried else device_fault(state)
                    if state.kind == ssd_loss.NAME:
                        fault = ssd_loss.listed(state, ssd_loss.ems_of(clients, state.device))
                    found[fault.id] = fault
        uncovered = [d for d in uncovered if d not in covered]
    return thermal_throttle.grouped(list(found.values()))


async def fabric_faults(clients: Clients) -> list[ActiveFault]:
    """Every supernode's fabric's faults (the EmulatorError its status names when a fabric
    does not answer)."""
    out = []
    for one in every_supernode(clients):
        call = one.fabric().ListFaults(fabric_pb2.ListFaultsRequest(), timeout=5.0)
        listed = await reply_of(None, call)
        out += [fabric.fabric_fault(f) for f in listed.faults]
    return out


async def list_all(clients: Clients) -> list[ActiveFault]:
    fabric_list, devices, rdma, containers = await asyncio.gather(
        fabric_faults(clients),
        device_faults(clients),
        gateway.listed(clients),
        container.listed(clients),
    )
    return [*fabric_list, *devices, *rdma, *process.listed(clients), *containers]


# --- clearing ------------------------------------------------------------------------------------


async def _clear_node(clients: Clients, fault_id: FaultId) -> None:
    """`node:<node>` (node-power-off: every device's crash), or a node-wide fault made of its
    NPUs' (`node:<node>:thermal-throttle`)."""
    if fault_id.kind == thermal_throttle.NAME:
        await thermal_throttle.clear(of_target(clients, fault_id.subject), fault_id)
        return
    if fault_id.kind:
        raise not_found(fault_id)
    devices = node_power_off.node_devices(clients, fault_id.subject)
    results = await asyncio.gather(
        *(clear_device(clients, d, "crash") for d in devices), return_exceptions=True
    )
    errors = [
        r for r in results if isinstance(r, BaseException) and not isinstance(r, NotFoundError)
    ]
    if errors:
        raise errors[0]
    if all(isinstance(r, BaseException) for r in results):
        raise not_found(fault_id)


async def _clear_device_fault(clients: Clients, fault_id: FaultId) -> None:
    device, kind = fault_id.subject, fault_id.device_kind
    owner = of_target(clients, device)
    owner.topology.device(device)  # an unknown device is its own NotFoundError, not the fault's
    try:
        await clear_device(owner, device, kind)
    except NotFoundError:
        raise NotFoundError(
            f"no fault {quote(str(fault_id))}: {device} is not faulted that way"
            " (see `cmemu fault ls`)",
            field="id",
            subject=str(fault_id),
            reason="FAULT_NOT_FOUND",
        ) from None


async def _clear_rack(clients: Clients, fault_id: FaultId) -> None:
    await rack_power_off.clear(of_target(clients, fault_id.subject), fault_id)


async def _clear_broker(clients: Clients, fault_id: FaultId) -> None:
    await broker_outage.clear(clients)


async def _clear_fabric_fault(clients: Clients, fault_id: FaultId) -> None:
    """A fabric fault's id names no supernode: the fabric that holds it clears it."""
    fabrics = every_supernode(clients)
    request = fabric_pb2.ClearFaultRequest(id=str(fault_id))
    for one in fabrics[:-1]:
        try:
            await reply_of(None, one.fabric().ClearFault(request))
            return
        except NotFoundError:
            pass
    await reply_of(None, fabrics[-1].fabric().ClearFault(request))


CLEARERS: dict[Family, Callable[[Clients, FaultId], Awaitable[None]]] = {
    Family.DEVICE: _clear_device_fault,
    Family.NODE: _clear_node,
    Family.RACK: _clear_rack,
    Family.CHECKPOINT: checkpoint_corrupt.clear,
    Family.PROCESS: process.clear,
    Family.CONTAINER: container.clear,
    Family.BROKER: _clear_broker,
    Family.RDMA: gateway.clear,
    Family.FABRIC: _clear_fabric_fault,
}
"""Who clears a fault, by its id's family (emulator/model/faults/ids.py)."""


async def clear(clients: Clients, fault_id: str | FaultId) -> None:
    """Clear one fault by the id `add` (or a listing) gave it; INVALID_ARGUMENT
    INVALID_FAULT_ID for text that is no fault id."""
    typed = fault_id if isinstance(fault_id, FaultId) else FaultId.parse(fault_id)
    await CLEARERS[typed.family](clients, typed)


remove = clear  # the name `cmemu fault rm` and older callers use


async def remove_all(clients: Clients) -> list[ActiveFault]:
    """Clear every fabric, device and process fault; what was cleared."""
    on_fabric, devices, rdma, containers = await asyncio.gather(
        fabric_faults(clients),
        device_faults(clients),
        gateway.listed(clients),
        container.listed(clients),
    )
    others = [*devices, *rdma, *process.listed(clients), *containers]
    if on_fabric:
        for one in every_supernode(clients):
            await reply_of(None, one.fabric().ClearFault(fabric_pb2.ClearFaultRequest(all=True)))
    results = await asyncio.gather(*(clear(clients, f.id) for f in others), return_exceptions=True)
    for r in results:  # a fault whose duration ended meanwhile is not an error
        if isinstance(r, BaseException) and not isinstance(r, NotFoundError):
            raise r
    return [*on_fabric, *others]


def device_of_fault(fault_id: str) -> str | None:
    """The device a `dev:` fault id names, or None for another id (or no id at all)."""
    try:
        typed = FaultId.parse(fault_id)
    except InvalidArgumentError:
        return None
    return typed.subject if typed.family is Family.DEVICE else None
