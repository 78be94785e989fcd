"""EMS passes by a hung pool in emulated time (EmsProfile.io_timeout_s, engines/deadline.py).

A read whose preferred copy sits on a pool that accepts the transaction and never answers gives
up on that copy after `io_timeout_s` emulated seconds and serves the other copy. The twin: with a
bound far away the same read is still waiting, and when the hang clears it completes from the
pool it waited on (nothing acknowledged is lost). The sweeps are off in both, so only the
transaction's own deadline can move the read on."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from cmemu.emulator.client import faults
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import DeviceKind, ServiceKind
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import ems_pb2, ems_pb2_grpc

HANG_S = 180  # a bound on a hang, not a timing
STILL_WAITING_S = 3.0  # wall seconds: a hung pool never answers, so any wait shows it


def _profile(io_timeout_s: float) -> HardwareProfile:
    ems = replace(DEFAULT_PROFILE.ems, io_timeout_s=io_timeout_s, check_interval_s=3600.0)
    return replace(DEFAULT_PROFILE, ems=ems)


async def _hung_read(io_timeout_s: float, *, passed_by: bool) -> None:
    async with running_supernode("cm-mini", profile=_profile(io_timeout_s)) as sn:
        clients = Clients(sn.topology)
        ems = ems_pb2_grpc.EmsStub(clients.channel_to(sn.topology.service(ServiceKind.EMS).address))
        data = bytes(range(256)) * 4
        put = await ems.Put(ems_pb2.PutRequest(key="kv-0", data=data))
        victim = put.replicas[0]
        node = sn.topology.device(victim).node
        reader = next(d.id for d in sn.topology.in_node(node) if d.kind is DeviceKind.NPU)
        hang = await faults.inject(clients, "hang", victim)
        read = asyncio.ensure_future(ems.Get(ems_pb2.GetRequest(key="kv-0", device=reader)))
        try:
            if passed_by:
                async with asyncio.timeout(HANG_S):
                    got = await read
                assert got.data == data and got.served_by == put.replicas[1]
            else:
                done, _ = await asyncio.wait({read}, timeout=STILL_WAITING_S)
                assert not done, "the read gave up on a pool within an hour of emulated time"
            await faults.clear(clients, hang.id)
            if not passed_by:  # the hang is over: the read it held completes from that pool
                async with asyncio.timeout(HANG_S):
                    got = await read
                assert got.data == data and got.served_by == victim
        finally:
            read.cancel()
            await clients.close()


async def test_a_read_passes_a_hung_pool_by_after_its_emulated_timeout() -> None:
    await _hung_read(2.0, passed_by=True)


async def test_a_read_waits_on_a_hung_pool_until_its_emulated_timeout() -> None:
    await _hung_read(3600.0, passed_by=False)
