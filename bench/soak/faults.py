"""The chaos: one fault at a time (link-down, switch-down on an L2 chip, NPU down, memory pool
down), held 1..5 s, with a share of the pool outages held past EMS's dead-after time in long runs
so that the store re-replicates and then reconciles the pool that returns; and clearing every
fault at the end, so that the verification reads a whole supernode."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable

import grpc

from bench.soak.config import CALL_TIMEOUT_S, DEAD_AFTER_S
from bench.soak.context import Soak
from cmemu.v1 import device_pb2, fabric_pb2

Clear = Callable[[], Awaitable[None]]  # clears the fault it was made for


class Chaos:
    """The fault loop, the faults now in force (in the soak's calls) and every device faulted."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.figures = soak.figures
        self.faulted_devices: set[str] = set()

    async def run(self) -> None:
        """One fault at a time: inject, hold, clear, pause."""
        soak, args = self.soak, self.soak.args
        rng = random.Random(args.seed * 1000 + 999)
        long_outages = args.seconds >= 2 * (DEAD_AFTER_S + 5.0)
        while not await soak.pause(rng.uniform(1.0, 4.0)):
            kind = rng.choices(
                ("link-down", "switch-down", "npu-down", "pool-down"), (35, 25, 25, 15)
            )[0]
            hold = rng.uniform(1.0, 5.0)
            if kind == "pool-down" and long_outages and rng.random() < args.long_outages:
                hold = DEAD_AFTER_S + 5.0  # declared dead: re-replicated, then reconciled
            clear = await self.inject(kind, rng)
            if clear is None:
                continue
            await soak.pause(min(hold, max(0.0, soak.stop_at - time.monotonic())))
            await clear()
            self.calls.faults_now.clear()

    def _injected(self, kind: str, target: str, t: float) -> None:
        self.calls.faults_now.append(f"{kind} {target}")
        self.figures.fault_log.append({"t": t, "kind": kind, "target": target})

    def _cleared(self) -> None:
        self.figures.fault_log[-1]["cleared"] = round(self.figures.now(), 2)

    async def inject(self, kind: str, rng: random.Random) -> Clear | None:
        """Inject one fault; the coroutine function that clears it (None if refused)."""
        t = round(self.figures.now(), 2)
        if kind in ("npu-down", "pool-down"):
            return await self._device_down(kind, rng, t)
        fabric = self.soak.fabric
        if kind == "link-down":
            stats = await self.calls.call(
                "fabric.link_stats",
                fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=500)),
            )
            if isinstance(stats, grpc.StatusCode) or not stats.links:
                return None
            target = rng.choice(list(stats.links)).link
        else:
            target = rng.choice(self.soak.l2_switches)
        fault = await self.calls.call(
            "fabric.inject_fault",
            fabric.InjectFault(
                fabric_pb2.FabricFault(kind=kind, target=target), timeout=CALL_TIMEOUT_S
            ),
            detail=f"{kind} {target}",
        )
        if isinstance(fault, grpc.StatusCode):
            return None
        self._injected(kind, target, t)

        async def clear_fabric() -> None:
            await self.calls.call(
                "fabric.clear_fault",
                fabric.ClearFault(
                    fabric_pb2.ClearFaultRequest(id=fault.id), timeout=CALL_TIMEOUT_S
                ),
                detail=fault.id,
            )
            self._cleared()

        return clear_fabric

    async def _device_down(self, kind: str, rng: random.Random, t: float) -> Clear | None:
        soak = self.soak
        device = rng.choice(soak.npus if kind == "npu-down" else soak.pools).id
        self.faulted_devices.add(device)
        done = await self.calls.call(
            "device.set_fault",
            soak.clients.device(device).SetFaultState(
                device_pb2.FaultState(faulted=True, reason="soak"), timeout=CALL_TIMEOUT_S
            ),
            detail=device,
        )
        if isinstance(done, grpc.StatusCode):
            return None
        self._injected(kind, device, t)

        async def clear_device() -> None:
            await self.calls.call(
                "device.clear_fault",
                soak.clients.device(device).SetFaultState(
                    device_pb2.FaultState(faulted=False), timeout=CALL_TIMEOUT_S
                ),
                detail=device,
            )
            self._cleared()

        return clear_device

    async def clear_all(self) -> None:
        """Every fault cleared: the fabric's all at once, and every device the soak faulted."""
        await self.soak.fabric.ClearFault(fabric_pb2.ClearFaultRequest(all=True))
        for device in sorted(self.faulted_devices):
            await self.soak.clients.device(device).SetFaultState(
                device_pb2.FaultState(faulted=False)
            )
        self.calls.faults_now.clear()
