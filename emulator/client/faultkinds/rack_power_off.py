"""rack-power-off: a correlated failure. A rack's power distribution fails and every device of
every node in it (nodes_per_rack nodes: 4 on CloudMatrix384) crashes at once, each a `crash`
fault, as node-power-off does for one node. Its id `rack:<rack>` clears them all; the manager
sees each NPU's crash on its own and raises an incident for it. A rack that is the whole
supernode (cm-mini's one rack) takes a duration: no device would be left to clear it through,
so its processes clear it themselves in emulated time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import (
    CALL_TIMEOUT_S,
    FALLBACK_REASONS,
    ActiveFault,
    Typed,
    clear_device,
    device_fault,
    not_found,
    spanning,
)
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds.crash import CrashParams
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, PreconditionError
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.racks import rack_devices
from cmemu.v1 import device_pb2

if TYPE_CHECKING:
    from cmemu.v1.device_pb2_grpc import DeviceAsyncStub

CRASH = "crash"


@dataclass(frozen=True, kw_only=True)
class RackPowerOff(Typed):
    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        devices = rack_devices(clients.topology, target)
        if len(devices) == len(clients.topology.devices) and not duration_s:
            raise PreconditionError(
                f"{target} holds every node of {clients.topology.supernode} "
                f"({clients.topology.preset}): with every device down none is left to clear "
                "the fault through; give it a duration (`--for`, a step's `duration`)",
                field="target",
                subject=target,
                reason="RACK_IS_THE_SUPERNODE",
            )
        # each crash told through a device that stays up: one outside the rack (a device told
        # to crash itself answers first and stops just after; a busy host can cut that answer
        # off), or, for a rack that is the whole supernode, its first device, crashed last
        outside = next((d.id for d in clients.topology.devices if d.id not in set(devices)), "")
        proxy = outside or devices[0]

        def crash(device: str) -> Awaitable[ActiveFault]:
            request = fault_request(CRASH, typed, for_s=duration_s, device=device)
            return _call(
                clients, device, proxy, lambda s: s.InjectFault(request, timeout=CALL_TIMEOUT_S)
            )

        rest = [d for d in devices if d != proxy]
        results: list[ActiveFault | BaseException] = list(
            await asyncio.gather(*(crash(d) for d in rest), return_exceptions=True)
        )
        if not outside:  # the proxy itself, last
            results += await asyncio.gather(crash(proxy), return_exceptions=True)
            rest.append(proxy)
        devices = rest
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or nothing: the devices that went down come back
            for device, result in zip(devices, results, strict=True):
                if not isinstance(result, BaseException):
                    with contextlib.suppress(Exception):
                        await _undo(clients, device, set(devices))
            raise failed[0]
        crashed = [r for r in results if isinstance(r, ActiveFault)]
        nodes = len({clients.topology.device(d).node for d in devices})
        return spanning(crashed, id=str(FaultId.rack(target)), kind=self.name, target=target,
                        detail=f"{len(devices)} devices of {nodes} nodes crashed")  # fmt: skip


async def _call(
    clients: Clients,
    device: str,
    proxy: str,
    call: Callable[[DeviceAsyncStub], Awaitable[device_pb2.FaultState]],
) -> ActiveFault:
    """`call` (an InjectFault or ClearFault for `device`) through `proxy`, or through the
    device itself where the proxy cannot answer for it (another process: NOT_IN_PROCESS)."""
    for via_device in dict.fromkeys([proxy, device]):
        try:
            return device_fault(await reply_of(None, call(clients.device(via_device))))
        except EmulatorError as exc:
            if via_device == device or exc.reason not in FALLBACK_REASONS:
                raise
    raise AssertionError("unreachable: the device itself is the last proxy")


async def _undo(clients: Clients, device: str, rack: set[str]) -> None:
    """Clear `device`'s crash through a device outside the rack first: the device itself may
    still be answering its own crash (it stops just after), and a clear it took then would
    restart the server the call came in on."""
    outside = next((d.id for d in clients.topology.devices if d.id not in rack), device)
    request = device_pb2.ClearDeviceFaultRequest(kind=CRASH, device=device)
    await _call(clients, device, outside, lambda s: s.ClearFault(request, timeout=CALL_TIMEOUT_S))


async def clear(clients: Clients, fault_id: FaultId) -> None:
    """Every device's crash of the rack (`rack:<rack>`); NotFoundError when none was down."""
    devices = rack_devices(clients.topology, fault_id.subject)
    results = await asyncio.gather(
        *(clear_device(clients, d, CRASH) for d in devices), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, NotFoundError):
            raise error
    if len(errors) == len(devices):
        raise not_found(fault_id)


KIND = RackPowerOff(
    name="rack-power-off",
    help="a rack loses power: every device of every node in it crashes at once",
    params=CrashParams,
    target="a rack id (e.g. rack00: nodes n00-n03 on cm384; sn1-rack00 in supernode 1)",
)
