"""What the fault kinds share: the typed-params contract, the active-fault record, fault ids, and
how a device fault reaches its device (itself, or a sibling in its process when its server is
gone). A kind is a small module beside this one, or, for a kind a device applies to itself, its
module of emulator/engines/device/kinds/, and for the fabric's and the gateway's, its module of
emulator/model/faults/fabric/ or gateway/; all are registered by name in
emulator/client/faults.py.

Fault ids are typed (emulator/model/faults/ids.py FaultId: one family per owner, one parser);
a device's are `dev:<device>` (device-down) and `dev:<device>:<kind>`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, quote
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.faults.params import params_from
from cmemu.v1 import device_pb2

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.faultbase import Kind as EngineKind
    from cmemu.v1.device_pb2_grpc import DeviceAsyncStub

FALLBACK_REASONS = {"NOT_IN_PROCESS", "PEER_UNREACHABLE"}
CALL_TIMEOUT_S = 30.0  # wall: a fault call answers at once, even on a hung device
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ActiveFault:
    id: str
    kind: str
    target: str
    detail: str = ""
    since_ns: int = 0  # emulated; 0 when the fault's owner does not say
    until_ns: int = 0  # emulated instant it clears itself; 0: until cleared


def spanning(
    parts: list[ActiveFault], *, id: str, kind: str, target: str, detail: str
) -> ActiveFault:
    """One fault made of per-device parts (a node's): from the first part's start to the last
    part's end."""
    return ActiveFault(
        id=id,
        kind=kind,
        target=target,
        detail=detail,
        since_ns=min(f.since_ns for f in parts),
        until_ns=max(f.until_ns for f in parts),
    )


class Kind(Protocol):
    """A fault kind: typed parameters, and how it is added (cleared by its fault id)."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    @property
    def params(self) -> type[Any]: ...

    @property
    def target(self) -> str: ...  # what TARGET names, for help; "" takes none

    def params_from(self, raw: Mapping[str, object]) -> Any: ...

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault: ...


@dataclass(frozen=True, kw_only=True)
class Typed:
    """The params half of every kind."""

    name: str
    help: str
    params: type[Any]
    target: str = "a device id"

    def params_from(self, raw: Mapping[str, object]) -> Any:
        return params_from(self.params, raw, kind=self.name)

    def typed(self, params: Any) -> Any:
        """Params given as a dict (a scenario's) or already typed."""
        return self.params_from(params or {}) if isinstance(params, Mapping) else params


def device_fault_id(device: str, kind: str = "device-down") -> str:
    return str(FaultId.device(device, kind))


def detail_of(state: device_pb2.FaultState) -> str:
    parts = [f"{k}={v}" for k, v in sorted(faultparams.params_text(state).items())]
    if state.reason:
        parts.append(f"reason={state.reason!r}")
    if state.until_ns:
        parts.append(f"until={state.until_ns / 1e9:.3f}s")
    return " ".join(parts)


def device_fault(state: device_pb2.FaultState) -> ActiveFault:
    kind = state.kind or "device-down"
    return ActiveFault(
        id=device_fault_id(state.device, kind),
        kind=kind,
        target=state.device,
        detail=detail_of(state),
        since_ns=state.since_ns,
        until_ns=state.until_ns,
    )


def proxies(clients: Clients, device: str, *, others_first: bool) -> list[str]:
    """Who may answer for `device`: itself, and devices that may share its process (one of
    another node — all share one process in-process — then its node's)."""
    topology = clients.topology
    node = topology.device(device).node
    same = [d.id for d in topology.devices if d.node == node and d.id != device]
    other = next((d.id for d in topology.devices if d.node != node), None)
    others = [*([other] if other else []), *same]
    return [*others, device] if others_first else [device, *others]


async def via(
    clients: Clients,
    device: str,
    call: Callable[[DeviceAsyncStub], Awaitable[T]],
    *,
    others_first: bool = False,
) -> T:
    """`call` on the first of `device`'s proxies that can answer for it; the EmulatorError its
    status names when none can (an unreachable proxy's UNAVAILABLE without details comes back as
    PEER_UNREACHABLE, so a fallback reason covers it)."""
    last: EmulatorError | None = None
    for proxy in proxies(clients, device, others_first=others_first):
        try:
            return await reply_of(None, call(clients.device(proxy)))
        except EmulatorError as exc:
            if exc.reason not in FALLBACK_REASONS:
                raise
            last = exc
    assert last is not None
    raise last


@dataclass(frozen=True, kw_only=True)
class DeviceKind(Typed):
    """A fault the device applies itself, with its duration: the client's side of one of
    emulator/engines/device/kinds/ (`of` makes it from that module's record)."""

    crash: bool = False  # its server goes: injected and cleared through a sibling

    @classmethod
    def of(cls, kind: EngineKind) -> DeviceKind:
        """The client's record of a device kind, from the kind's own module."""
        return cls(
            name=kind.name, help=kind.help, params=kind.params, target=kind.target, crash=kind.crash
        )

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        device = clients.topology.device(target).id
        request = fault_request(self.name, self.typed(params), for_s=duration_s, device=device)
        stored = await via(
            clients,
            device,
            lambda stub: stub.InjectFault(request, timeout=CALL_TIMEOUT_S),
            others_first=self.crash,
        )
        return device_fault(stored)


async def clear_device(clients: Clients, device: str, kind: str) -> None:
    clients.topology.device(device)
    request = device_pb2.ClearDeviceFaultRequest(kind=kind, device=device)
    await via(clients, device, lambda stub: stub.ClearFault(request, timeout=CALL_TIMEOUT_S))


def not_found(fault_id: str | FaultId) -> NotFoundError:
    return NotFoundError(
        f"no fault {quote(fault_id)} (see `cmemu fault ls`)",
        field="id",
        subject=str(fault_id),
        reason="FAULT_NOT_FOUND",
    )
