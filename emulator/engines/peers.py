"""How an engine reaches another device or service: one protocol per kind of peer, two
implementations of each, and the runtime wires which.

- In one process, the peer is the other engine itself (`LocalDevice` below wraps a device engine
  so that a direct call behaves as a remote one would: a crashed device refuses, a hung one never
  answers until the caller's deadline).
- Across processes, the peer is the typed gRPC client (emulator/client/), which translates to
  and from the wire and raises the same EmulatorErrors as a direct call.

So a UB transaction in the in-process supernode costs one gRPC call (the client's) and one
translation each way, and an engine never knows where its peers live. Both raise EmulatorError
subclasses carrying the google.rpc reason; nothing above this line catches transport errors.

A gateway of the RDMA plane reaches the others (and its own supernode's NPUs) the same way:
`GatewayPeer`, with `LocalGateway` (emulator/engines/gateway/local.py) for an engine of this
process.

The control plane's peers (the scheduler, the router, the training jobs, a server's health) are
what the cluster manager's engine calls (`ControlPlane`); the router is reached over gRPC even in
one process, the scheduler directly where its engine is hosted (engines/scheduler/local.py,
through its outage: a killed or hung scheduler looks the same whichever launcher runs it). A
training job (engines/training/) reaches the scheduler (`JobScheduler`) and EMS (`ObjectStore`)
the same way (engines/scheduler/local.py, engines/ems/local.py, or the typed clients), and the
fabric through its `FabricPeer`; a serving deployment (engines/serving/) too, its EMS and
directory as engines/serving/peers.py extends them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cmemu.emulator.model.arrivals import ArrivalBatch
from cmemu.emulator.model.errors import (
    DeadlineExceededError,
    EmulatorError,
    PreconditionError,
    relayed,
)
from cmemu.emulator.model.memory import Region, RegionPage
from cmemu.emulator.model.topology import Device, Service
from cmemu.emulator.model.ub import Completion, Transaction

if TYPE_CHECKING:  # the scheduler's model package is imported only where it runs (not by devices)
    from cmemu.emulator.engines.clock import ClockState
    from cmemu.emulator.engines.device.engine import DeviceEngine, FaultState, Telemetry
    from cmemu.emulator.engines.device.liveness import Beat
    from cmemu.emulator.engines.device.npu import Kernel, KernelResult
    from cmemu.emulator.engines.fabric.engine import FabricEngine
    from cmemu.emulator.engines.gateway.types import (
        Landing,
        LinkStats,
        OpRequest,
        OpResult,
        Qp,
        RdmaOp,
        RouteInfo,
        TimedFlow,
    )
    from cmemu.emulator.model.collectivespec import CollectiveSpec
    from cmemu.emulator.model.ems.objects import Got, ObjectKind, Put
    from cmemu.emulator.model.faults.fabric import FaultSpec
    from cmemu.emulator.model.rdmafault import RdmaFault
    from cmemu.emulator.model.scheduler.grants import Allocation, AllocationChange
    from cmemu.emulator.model.scheduler.jobs import Replacement

T = TypeVar("T")


class DevicePeer(Protocol):
    """Another device, as engines call it."""

    # timed: the caller (the fabric) times it and replaces the timing: the target prices nothing
    async def deliver(
        self, tx: Transaction, *, check_only: bool, deadline_s: float | None, timed: bool = False
    ) -> Completion: ...

    async def submit(self, tx: Transaction, *, deadline_s: float | None) -> Completion: ...

    async def allocate(self, size: int, label: str, *, deadline_s: float | None) -> Region: ...

    async def free(self, region_id: int, *, deadline_s: float | None) -> int: ...

    async def list_regions(self, page_token: str, *, deadline_s: float | None) -> RegionPage:
        """A page of the device's live regions ("" from the start; then the page's token)."""
        ...

    async def fault_state(self, *, deadline_s: float | None) -> FaultState: ...

    async def telemetry(self, *, deadline_s: float | None) -> Telemetry:
        """What the device reports of itself (its faults and dies down among it)."""
        ...

    async def kernel(self, kernel: Kernel, *, deadline_s: float | None) -> KernelResult:
        """A kernel on one of an NPU's dies (the manager's diagnosis of a straggler)."""
        ...

    def watch_liveness(self) -> AsyncIterator[Beat]:
        """The liveness of the device's process (engines/device/liveness.py), streamed."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowTime:
    """One flow of a collective: ranks by endpoint name, completion from the collective's start."""

    src: str
    dst: str
    bytes: int
    complete_ns: int
    gb_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectiveOutcome:
    """A collective timed by the fabric, as its caller sees it."""

    op: str
    ranks: int
    phases: int
    flows: int
    total_bytes: int
    issue_ns: int
    complete_ns: int
    overhead_ns: int
    wall_compute_ms: float
    detail: tuple[FlowTime, ...] = ()  # every flow, when asked for
    compute_share: float = 1.0  # the slowest rank's compute share (a `slow` NPU's)

    @property
    def duration_ns(self) -> int:
        return self.complete_ns - self.issue_ns


class FabricPeer(Protocol):
    """The supernode's fabric: the timing authority of UB transfers and collectives."""

    async def transfer(self, tx: Transaction, *, deadline_s: float | None) -> Completion: ...

    async def collective(
        self,
        ranks: Sequence[str],
        spec: CollectiveSpec,
        *,
        detail: bool = False,
        deadline_s: float | None = None,
    ) -> CollectiveOutcome: ...

    async def collective_arrivals(self, after_seq: int, *, limit: int = 0) -> ArrivalBatch:
        """The ranks' arrivals of the collectives timed after `after_seq`."""
        ...

    async def link_fault(self, spec: FaultSpec[Any]) -> FaultSpec[Any]: ...

    async def clear_fault(self, fault_id: str) -> None: ...

    def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]: ...


class Directory(Protocol):
    """Every peer of an engine, by id; the runtime decides which are local."""

    def device(self, device: Device) -> DevicePeer: ...

    def fabric(self) -> FabricPeer: ...

    async def forget(self, device: Device) -> None:
        """Drop what reaches `device` (a channel, with the address it resolved): its name
        answered as another process, so the next call must look it up again."""
        ...


class GatewayPeer(Protocol):
    """A gateway of the RDMA plane, as another gateway (or a KV transfer) calls it. A down
    gateway refuses what it would refuse over gRPC (GATEWAY_DOWN); errors come back prefixed
    with the gateway's id, as a relayed status reads."""

    async def create_qp(self, npu: str, die: int, *, deadline_s: float | None) -> Qp: ...

    async def connect_qp(
        self, qpn: int, remote_gateway: str, remote_qpn: int, *, deadline_s: float | None
    ) -> Qp: ...

    async def accept_qp(
        self,
        qpn: int,
        *,
        peer_gateway: str,
        peer_qpn: int,
        peer_npu: str,
        peer_die: int,
        deadline_s: float | None,
    ) -> Qp:
        """Agree to connect one of its queue pairs to the caller's."""
        ...

    async def op(self, op: RdmaOp, request: OpRequest, *, deadline_s: float | None) -> OpResult:
        """WRITE, READ or SEND on one of its connected queue pairs."""
        ...

    async def land(self, landing: Landing, *, deadline_s: float | None) -> bytes:
        """Check or apply an op on an NPU of its supernode; the bytes a READ brings back."""
        ...

    async def time_flow(
        self, src: str, dst: str, size: int, issue_ns: int, *, deadline_s: float | None
    ) -> TimedFlow:
        """The plane's timing of a flow (the authority, sn0's gateway, only)."""
        ...

    async def link_stats(self, top: int, *, deadline_s: float | None) -> LinkStats: ...

    async def route(self, src: str, dst: str, *, deadline_s: float | None) -> RouteInfo: ...

    async def inject_fault(
        self, fault: RdmaFault[Any], *, deadline_s: float | None
    ) -> RdmaFault[Any]: ...

    async def clear_fault(
        self, fault_id: str, *, all: bool, deadline_s: float | None
    ) -> list[RdmaFault[Any]]: ...

    async def list_faults(self, *, deadline_s: float | None) -> list[RdmaFault[Any]]: ...


class GatewayDirectory(Protocol):
    """Every peer of a gateway's engine: its supernode's NPUs and the plane's gateways."""

    def device(self, device: Device) -> DevicePeer: ...

    def gateway(self, gateway: Service) -> GatewayPeer: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Marked:
    """What the scheduler changed when told an NPU failed or is healthy again."""

    npus: tuple[str, ...]  # the NPUs whose state changed (not those already so)
    affected_jobs: tuple[str, ...] = ()  # MarkFailed: the jobs holding any of the NPUs


class SchedulerPeer(Protocol):
    """The supernode's scheduler, as the cluster manager isolates and replaces NPUs with it."""

    async def mark_failed(self, npu: str) -> Marked: ...

    async def mark_healthy(self, npu: str) -> Marked: ...

    async def replace(self, job: str, npu: str) -> tuple[Replacement, ...]:
        """Spares in place of `npu` in `job`'s allocation."""
        ...


class RouterPeer(Protocol):
    """The serving router, as the cluster manager follows a deployment's restore."""

    async def last_restored_ns(self, deployment: str) -> int:
        """The emulated instant of the deployment's last restore (0: never)."""
        ...


class TrainingPeer(Protocol):
    """The training jobs (hosted on the manager's server), as the manager follows a restore."""

    async def last_restored_ns(self, job: str) -> int | None:
        """The emulated instant of the job's last restore (0: never); None: no such job."""
        ...


class AllocationWatch(Protocol):
    """An open stream of an allocation's changes: iterate it; `cancel` it when done."""

    def __aiter__(self) -> AllocationWatch: ...

    async def __anext__(self) -> AllocationChange: ...

    def cancel(self) -> None: ...


class JobScheduler(Protocol):
    """The scheduler, as a training job (engines/training/) holds its NPUs with it: its engine
    in this process (engines/scheduler/local.py), else the typed client (emulator/client/
    scheduler.py). A refusal is the engine's EmulatorError, the same either way."""

    async def allocate(self, job: str, npus: int) -> Allocation: ...

    async def allocation(self, job: str) -> Allocation: ...

    def watch(self, job: str = "") -> AllocationWatch:
        """Each change of `job`'s allocation from now on (opened before the first is asked)."""
        ...

    async def release(self, job: str) -> object: ...


class ObjectStore(Protocol):
    """EMS, as a training job keeps its checkpoints in it: its engine in this process
    (engines/ems/local.py), else the typed client (emulator/client/ems.py). A put or a read
    into `device` is timed to it."""

    async def put(
        self,
        key: str,
        data: bytes = b"",
        *,
        size: int = 0,
        kind: ObjectKind = ...,  # (ObjectKind.KV) for annotations only: a device loads no EMS model
        device: str = "",
    ) -> Put: ...

    async def load(self, key: str, *, device: str = "") -> Got: ...

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Remove objects (one already gone is no error)."""
        ...


class ControlPlane(Directory, Protocol):
    """Every peer of the cluster manager's engine: devices and the fabric, and the services it
    acts through."""

    def scheduler(self) -> SchedulerPeer: ...

    def router(self) -> RouterPeer: ...

    def training(self) -> TrainingPeer: ...

    async def serving(self, address: str, *, deadline_s: float) -> bool:
        """The server at `address` answers SERVING within the deadline (False for any other
        answer, or none): the manager asks its own, which a stopping launcher turns off."""
        ...


async def within(deadline_s: float | None, call: Awaitable[T]) -> T:
    """An in-process call's deadline, ended as a gRPC call's would be (DEADLINE_EXCEEDED).
    Wall seconds, as the wire's deadline it stands in for is: a property of the transport, not
    of the emulated device. A caller that judges a device by its answer bounds its wait in
    emulated time instead (engines/deadline.py) and passes None here."""
    if deadline_s is None:
        return await call
    try:
        async with asyncio.timeout(deadline_s):
            return await call
    except TimeoutError:
        raise DeadlineExceededError(f"deadline exceeded ({deadline_s:.3g} s)") from None


class LocalDevice:
    """A device engine of this process, called as a remote device would be: through its gate
    (a crash refuses, a hang never answers) and under the caller's deadline. Its errors come
    back prefixed with the device's id, as a relayed status does."""

    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine

    async def _call(
        self, method: str, call: Awaitable[T], deadline_s: float | None, *, waits: bool = False
    ) -> T:
        """`waits`: the call itself may suspend (a Submit awaits the fabric). One that cannot
        (every other: the engine answers at once) and meets an open gate has nothing for a
        deadline to end, so it runs without one: no timer armed and cancelled per call on the
        UB hot path (the fabric's two Delivers of every transaction)."""
        engine = self.engine
        gate_open = not engine.effects.crashed and engine.effects.answering.open
        if gate_open and (not waits or deadline_s is None):  # nothing to bound: no frame more
            try:
                return await call
            except EmulatorError as exc:
                raise relayed(exc, engine.device.id) from exc

        async def gated() -> T:
            await engine.admit(method)
            return await call

        try:  # an open gate admits at once: no coroutine and admit() per call to pass it
            return await within(deadline_s, call if gate_open else gated())
        except EmulatorError as exc:
            raise relayed(exc, engine.device.id) from exc
        finally:
            if asyncio.iscoroutine(call):
                call.close()  # never awaited when the gate refused: no warning

    async def deliver(
        self, tx: Transaction, *, check_only: bool, deadline_s: float | None, timed: bool = False
    ) -> Completion:
        """The bus's plain call (the fabric's Delivers of every transaction) through `_answer`:
        through an open gate no coroutine is made for it."""
        bus = self.engine.bus
        return await self._answer("Deliver", bus.deliver, deadline_s, tx, check_only, timed)

    async def submit(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        engine = self.engine
        if deadline_s is None and not engine.effects.crashed and engine.effects.answering.open:
            try:  # `_call`'s open gate and no deadline, without its frame (EMS's every copy)
                return await engine.bus.submit(tx, None)
            except EmulatorError as exc:
                raise relayed(exc, engine.device.id) from exc
        return await self._call("Submit", engine.bus.submit(tx, deadline_s), deadline_s, waits=True)

    async def _answer(
        self, method: str, function: Callable[..., T], deadline_s: float | None, *args: object
    ) -> T:
        """An engine call that answers at once: through an open gate, called here and now (no
        coroutine to wrap it, as EMS's allocations and frees of every put would make); else
        through the gate as `_call` passes it."""
        engine = self.engine
        if not engine.effects.crashed and engine.effects.answering.open:
            try:
                return function(*args)
            except EmulatorError as exc:
                raise relayed(exc, engine.device.id) from exc
        return await self._call(method, _now(function, *args), deadline_s)

    async def allocate(self, size: int, label: str, *, deadline_s: float | None) -> Region:
        return await self._answer("AllocateRegion", self.engine.allocate, deadline_s, size, label)

    async def free(self, region_id: int, *, deadline_s: float | None) -> int:
        return await self._answer("FreeRegion", self.engine.free, deadline_s, region_id)

    async def list_regions(self, page_token: str, *, deadline_s: float | None) -> RegionPage:
        return await self._call(
            "ListRegions", _now(self.engine.region_page, page_token, 0), deadline_s
        )

    async def fault_state(self, *, deadline_s: float | None) -> FaultState:
        return await self._call("GetFaultState", _now(self.engine.fault_state), deadline_s)

    async def telemetry(self, *, deadline_s: float | None) -> Telemetry:
        return await self._call("GetTelemetry", _now(self.engine.telemetry), deadline_s)

    async def kernel(self, kernel: Kernel, *, deadline_s: float | None) -> KernelResult:
        return await self._call("SubmitKernel", _now(self.engine.dies.run, kernel), deadline_s)

    def watch_liveness(self) -> AsyncIterator[Beat]:
        engine = self.engine
        if engine.effects.crashed:  # its server is gone: ask a sibling
            raise engine.unreachable()
        if engine.liveness is None:
            raise PreconditionError(
                f"{engine.device.id}'s process keeps no liveness", reason="NO_LIVENESS"
            )
        return engine.liveness.watch()


async def _now(function: Callable[..., T], *args: object) -> T:
    return function(*args)


class LocalFabric:
    """The fabric engine of this process, called as the remote fabric would be: through its
    outage (a down fabric service refuses, a hung one never answers; engines/fabric/outage.py)."""

    def __init__(self, engine: FabricEngine) -> None:
        self.engine = engine
        self.outage = engine.outage

    async def transfer(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        if self.outage.how:  # the hot path awaits nothing while the fabric is up
            await self.outage.admit(deadline_s)
        return await self.engine.transfer(tx, deadline_s=deadline_s)

    async def collective(
        self,
        ranks: Sequence[str],
        spec: CollectiveSpec,
        *,
        detail: bool = False,
        deadline_s: float | None = None,
    ) -> CollectiveOutcome:
        if self.outage.how:  # the hot path awaits nothing while the fabric is up
            await self.outage.admit(deadline_s)
        return await within(deadline_s, self.engine.collective(ranks, spec, detail=detail))

    async def collective_arrivals(self, after_seq: int, *, limit: int = 0) -> ArrivalBatch:
        if self.outage.how:
            await self.outage.admit(None)
        return self.engine.collective_arrivals(after_seq, limit)

    async def link_fault(self, spec: FaultSpec[Any]) -> FaultSpec[Any]:
        if self.outage.how:
            await self.outage.admit(None)
        return self.engine.add_fault(spec)

    async def clear_fault(self, fault_id: str) -> None:
        if self.outage.how:
            await self.outage.admit(None)
        self.engine.clear_fault(fault_id)

    def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]:
        raise PreconditionError(
            "the fabric shares this process's clock: there is nothing to follow",
            reason="SAME_PROCESS",
        )
