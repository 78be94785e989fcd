"""Region churn on a fixed set of devices (allocate, write, read back, free): region bookkeeping
that leaks; and the sweep at the end that frees what churn left and counts it."""

from __future__ import annotations

import random

import grpc

from bench.soak.calls import pages
from bench.soak.config import CALL_TIMEOUT_S, CHURN_DEVICES, CHURN_LABEL, KIB, MIB, log_uniform
from bench.soak.context import Soak
from cmemu.v1 import device_pb2, ub_pb2


class Churn:
    """The churn devices (drawn from the run's RNG when made: before the setup draws) and the
    regions whose free failed."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.devices = [d.id for d in soak.rng.sample(soak.all_devices, CHURN_DEVICES)]
        self.leaked: list[tuple[str, int]] = []

    async def churn(self, rng: random.Random) -> None:
        device = rng.choice(self.devices)
        size = log_uniform(rng, 4 * KIB, MIB)
        region = await self.calls.call(
            "device.allocate",
            self.soak.clients.device(device).AllocateRegion(
                device_pb2.AllocateRegionRequest(size=size, label=CHURN_LABEL),
                timeout=CALL_TIMEOUT_S,
            ),
            detail=f"{device} {size} B",
        )
        if isinstance(region, grpc.StatusCode):
            return
        data = rng.randbytes(min(size, log_uniform(rng, 1, 64 * KIB)))
        src, _ = self.soak.issuer(rng)
        dst = ub_pb2.UbAddress(eid=region.eid, offset=region.offset)
        wrote = await self.calls.call(
            "ub.write",
            self.soak.submit(src, ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=data)),
            detail=f"churn {src} -> {device}",
        )
        if not isinstance(wrote, grpc.StatusCode):
            back = await self.calls.call(
                "ub.read",
                self.soak.submit(
                    src, ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=len(data))
                ),
                detail=f"churn {src} <- {device}",
            )
            if not isinstance(back, grpc.StatusCode) and back.data != data:
                self.calls.wrong(f"UB read of a fresh region on {device} by {src} differs")
        freed = await self.calls.call(
            "device.free",
            self.soak.clients.device(device).FreeRegion(
                device_pb2.FreeRegionRequest(region_id=region.region_id), timeout=CALL_TIMEOUT_S
            ),
            detail=device,
        )
        if isinstance(freed, grpc.StatusCode):
            self.leaked.append((device, region.region_id))

    async def sweep(self) -> dict[str, int]:
        """Free what churn left (a failed free, a lost reply); count the regions not freed."""
        strays = 0
        for device in self.devices:
            strays += await self._sweep(device)
        return {"churn_regions_left": strays, "churn_frees_failed": len(self.leaked)}

    async def _sweep(self, device: str) -> int:
        stub = self.soak.clients.device(device)
        strays = 0
        async for page in pages(
            lambda token: stub.ListRegions(device_pb2.ListRegionsRequest(page_token=token))
        ):
            for r in page.regions:
                if r.label == CHURN_LABEL:
                    strays += 1
                    await stub.FreeRegion(device_pb2.FreeRegionRequest(region_id=r.region_id))
        return strays
