"""The cluster manager's reach into its supernode, severable: a `service-partition` of the manager
cuts it off from everything it watches and acts through, while it keeps running.

A partition drops packets; it refuses nothing. So while severed a call goes unanswered until its
deadline (DEADLINE_EXCEEDED), or, with none, until the partition heals (then it is reset,
UNAVAILABLE, as a connection that lost its packets is); an open liveness stream carries no beat
(they are lost), and one opened meanwhile waits for the partition to heal before it connects. A
stream that outlives a short partition simply carries beats again, as TCP would.

Not cut: what lives on the manager's own server (the training jobs it hosts, its own health).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from cmemu.emulator.engines.peers import (
    CollectiveOutcome,
    ControlPlane,
    DevicePeer,
    FabricPeer,
    Marked,
    RouterPeer,
    SchedulerPeer,
    TrainingPeer,
    within,
)
from cmemu.emulator.model.arrivals import ArrivalBatch
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.memory import Region, RegionPage
from cmemu.emulator.model.topology import Device
from cmemu.emulator.model.ub import Completion, Transaction

if TYPE_CHECKING:
    from cmemu.emulator.engines.clock import ClockState
    from cmemu.emulator.engines.device.engine import FaultState, Telemetry
    from cmemu.emulator.engines.device.liveness import Beat
    from cmemu.emulator.engines.device.npu import Kernel, KernelResult
    from cmemu.emulator.model.collectivespec import CollectiveSpec
    from cmemu.emulator.model.faults.fabric import FaultSpec
    from cmemu.emulator.model.scheduler.jobs import Replacement

REASON = "PARTITIONED"


class Link:
    """Whether the manager's network reaches the supernode; awaited by every severed call."""

    def __init__(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()

    @property
    def severed(self) -> bool:
        return not self._healed.is_set()

    def sever(self) -> None:
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()

    async def healed(self) -> None:
        await self._healed.wait()

    async def lost(self, deadline_s: float | None, what: str) -> None:
        """A call made while severed: its deadline runs out, or it is reset when the partition
        heals (its packets are gone either way)."""
        await within(deadline_s, self._healed.wait())
        raise UnavailableError(f"{what}: lost in a partition of the cluster manager", reason=REASON)

    async def check(self, deadline_s: float | None, what: str) -> None:
        if self.severed:
            await self.lost(deadline_s, what)


class SeveredDevice:
    """A device as the manager reaches it through its Link."""

    def __init__(self, inner: DevicePeer, link: Link, name: str) -> None:
        self.inner, self.link, self.name = inner, link, name

    async def deliver(
        self, tx: Transaction, *, check_only: bool, deadline_s: float | None, timed: bool = False
    ) -> Completion:
        await self.link.check(deadline_s, self.name)
        return await self.inner.deliver(
            tx, check_only=check_only, deadline_s=deadline_s, timed=timed
        )

    async def submit(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        await self.link.check(deadline_s, self.name)
        return await self.inner.submit(tx, deadline_s=deadline_s)

    async def allocate(self, size: int, label: str, *, deadline_s: float | None) -> Region:
        await self.link.check(deadline_s, self.name)
        return await self.inner.allocate(size, label, deadline_s=deadline_s)

    async def free(self, region_id: int, *, deadline_s: float | None) -> int:
        await self.link.check(deadline_s, self.name)
        return await self.inner.free(region_id, deadline_s=deadline_s)

    async def list_regions(self, page_token: str, *, deadline_s: float | None) -> RegionPage:
        await self.link.check(deadline_s, self.name)
        return await self.inner.list_regions(page_token, deadline_s=deadline_s)

    async def fault_state(self, *, deadline_s: float | None) -> FaultState:
        await self.link.check(deadline_s, self.name)
        return await self.inner.fault_state(deadline_s=deadline_s)

    async def telemetry(self, *, deadline_s: float | None) -> Telemetry:
        await self.link.check(deadline_s, self.name)
        return await self.inner.telemetry(deadline_s=deadline_s)

    async def kernel(self, kernel: Kernel, *, deadline_s: float | None) -> KernelResult:
        await self.link.check(deadline_s, self.name)
        return await self.inner.kernel(kernel, deadline_s=deadline_s)

    async def watch_liveness(self) -> AsyncIterator[Beat]:
        await self.link.healed()  # an open's packets wait for the partition to heal
        async for beat in self.inner.watch_liveness():
            if not self.link.severed:  # a beat sent across the partition is lost
                yield beat


class SeveredFabric:
    def __init__(self, inner: FabricPeer, link: Link) -> None:
        self.inner, self.link = inner, link

    async def transfer(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        await self.link.check(deadline_s, "the fabric")
        return await self.inner.transfer(tx, deadline_s=deadline_s)

    async def collective(
        self,
        ranks: Sequence[str],
        spec: CollectiveSpec,
        *,
        detail: bool = False,
        deadline_s: float | None = None,
    ) -> CollectiveOutcome:
        await self.link.check(deadline_s, "the fabric")
        return await self.inner.collective(ranks, spec, detail=detail, deadline_s=deadline_s)

    async def collective_arrivals(self, after_seq: int, *, limit: int = 0) -> ArrivalBatch:
        await self.link.check(None, "the fabric")
        return await self.inner.collective_arrivals(after_seq, limit=limit)

    async def link_fault(self, spec: FaultSpec[Any]) -> FaultSpec[Any]:
        await self.link.check(None, "the fabric")
        return await self.inner.link_fault(spec)

    async def clear_fault(self, fault_id: str) -> None:
        await self.link.check(None, "the fabric")
        await self.inner.clear_fault(fault_id)

    def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]:
        return self.inner.follow(process, wishes)  # time is not the manager's to lose


class SeveredScheduler:
    def __init__(self, inner: SchedulerPeer, link: Link) -> None:
        self.inner, self.link = inner, link

    async def mark_failed(self, npu: str) -> Marked:
        await self.link.check(None, "the scheduler")
        return await self.inner.mark_failed(npu)

    async def mark_healthy(self, npu: str) -> Marked:
        await self.link.check(None, "the scheduler")
        return await self.inner.mark_healthy(npu)

    async def replace(self, job: str, npu: str) -> tuple[Replacement, ...]:
        await self.link.check(None, "the scheduler")
        return await self.inner.replace(job, npu)


class SeveredRouter:
    def __init__(self, inner: RouterPeer, link: Link) -> None:
        self.inner, self.link = inner, link

    async def last_restored_ns(self, deployment: str) -> int:
        await self.link.check(None, "the router")
        return await self.inner.last_restored_ns(deployment)


class SeveredPlane:
    """The manager's ControlPlane through its Link."""

    def __init__(self, inner: ControlPlane, link: Link) -> None:
        self.inner, self.link = inner, link

    def device(self, device: Device) -> DevicePeer:
        return SeveredDevice(self.inner.device(device), self.link, device.id)

    def fabric(self) -> FabricPeer:
        return SeveredFabric(self.inner.fabric(), self.link)

    async def forget(self, device: Device) -> None:
        await self.inner.forget(device)

    def scheduler(self) -> SchedulerPeer:
        return SeveredScheduler(self.inner.scheduler(), self.link)

    def router(self) -> RouterPeer:
        return SeveredRouter(self.inner.router(), self.link)

    def training(self) -> TrainingPeer:
        return self.inner.training()  # hosted on the manager's own server

    async def serving(self, address: str, *, deadline_s: float) -> bool:
        return await self.inner.serving(address, deadline_s=deadline_s)  # its own server
