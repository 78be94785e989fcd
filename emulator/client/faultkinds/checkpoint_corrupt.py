"""checkpoint-corrupt: a training job's latest checkpoint in EMS is corrupt. Its manifest (the
real bytes that list its shards, written last; emulator/model/training/checkpoint.py) is
silently corrupted on every pool that holds a copy, as an `sdc` of that copy's region: reads
succeed with flipped bits. Nothing notices until the job restores: EMS finds the copies fail
their CRC-32 (DATA_LOSS CHECKSUM_MISMATCH), and the job falls back to the checkpoint before it,
losing the steps between them (`checkpoint-corrupt` event, `steps_lost`).

Its id `ckpt:<job>:<step>:<pool>,<pool>` names what it corrupted; clearing it clears those
`sdc` faults (the pools' reads are right again; copies EMS dropped stay dropped)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import (
    ActiveFault,
    Typed,
    clear_device,
    not_found,
    spanning,
)
from cmemu.emulator.client.faultkinds.base import DeviceKind as OnOneDevice
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.training import TrainingClient
from cmemu.emulator.engines.device.kinds import sdc
from cmemu.emulator.engines.device.kinds.sdc import SdcParams
from cmemu.emulator.model.errors import NotFoundError, PreconditionError, quote
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.model.training.checkpoint import manifest_key
from cmemu.v1 import device_pb2

SDC = OnOneDevice.of(sdc.KIND)


async def _copies(clients: Clients, key: str) -> list[tuple[str, int]]:
    """(pool, region id) of every copy of `key` the pools hold."""
    pools = [d.id for d in clients.topology.devices if d.kind is DeviceKind.MEMPOOL]
    listed = await asyncio.gather(
        *(
            reply_of(None, clients.device(p).ListRegions(device_pb2.ListRegionsRequest()))
            for p in pools
        ),
        return_exceptions=True,
    )
    return [
        (pool, r.region_id)
        for pool, reply in zip(pools, listed, strict=True)
        if isinstance(reply, device_pb2.ListRegionsResponse)
        for r in reply.regions
        if r.label.endswith(f"|{key}")
    ]


@dataclass(frozen=True, kw_only=True)
class CheckpointCorrupt(Typed):
    target: str = "a training job's name (cmemu train ls)"

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        self.typed(params)
        job = await TrainingClient(clients).get(target)
        step = job.last_checkpoint_step
        if not step:
            raise PreconditionError(
                f"training job {quote(target)} has no checkpoint yet (step {job.step})",
                field="target",
                subject=target,
                reason="NO_CHECKPOINT",
            )
        key = manifest_key(target, step)
        copies = await _copies(clients, key)
        if not copies:
            raise NotFoundError(
                f"no copy of {quote(key)} on any pool",
                field="target",
                subject=target,
                reason="CHECKPOINT_NOT_FOUND",
            )
        corrupted: list[ActiveFault] = []
        try:
            for pool, region in copies:
                corrupted.append(await SDC.add(clients, pool, SdcParams(region=region), duration_s))
        except BaseException:  # all or nothing: undo the copies corrupted so far
            for done in corrupted:
                with contextlib.suppress(Exception):
                    await clear_device(clients, done.target, SDC.name)
            raise
        pools = tuple(pool for pool, _ in copies)
        fault_id = FaultId.checkpoint(target, step, pools)
        return spanning(corrupted, id=str(fault_id), kind=self.name, target=target,
                        detail=f"step {step}: {key} on {','.join(pools)}")  # fmt: skip


async def clear(clients: Clients, fault_id: FaultId) -> None:
    """The sdc of every pool the id names (`ckpt:<job>:<step>:<pools>`)."""
    pools = fault_id.pools
    missing = 0
    for pool in pools:
        try:
            await clear_device(clients, pool, SDC.name)
        except NotFoundError:
            missing += 1
    if missing == len(pools):
        raise not_found(fault_id)


KIND = CheckpointCorrupt(
    name="checkpoint-corrupt",
    help="a training job's latest checkpoint in EMS is silently corrupt: its restore finds it "
    "by checksum and falls back to the one before",
    params=NoParams,
)
