"""A partition of the cluster manager (service-partition, issue 20 item 4), on an in-process
cm-mini over real gRPC: the manager runs on but nothing reaches it (its own server answers
nothing) and it reaches nothing (emulator/engines/manager/link.py), so every liveness beat is
lost. Guarded, it suspects itself cut off and fails no device (an event says so, and another
when it rejoins); its twin with the guard off (`manager.cut_off_share` 1) fails the whole
healthy supernode on that silence: the guard, not luck, is what keeps it in service."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.runtime.supernode import EMBEDDED
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import fabric_pb2, manager_pb2
from tests.engines.manager.test_actions import SCALE, incidents, until
from tests.runtime.test_mqtt import listening

SILENT_S = 120.0  # emulated: eight heartbeat intervals, past the silence window (3 misses)


def _profile(cut_off_share: float) -> HardwareProfile:
    manager = dataclasses.replace(DEFAULT_PROFILE.manager, cut_off_share=cut_off_share)
    return dataclasses.replace(DEFAULT_PROFILE, manager=manager)


async def _emulated_s(clients: Clients) -> float:
    reply = await clients.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=30)
    return reply.emulated_ns / 1e9


@pytest.mark.parametrize("guarded", [True, False])
async def test_a_partitioned_manager_fails_no_device_and_says_it_is_cut_off(
    guarded: bool,
) -> None:
    profile = DEFAULT_PROFILE if guarded else _profile(1.0)
    async with (
        running_supernode("cm-mini", time_scale=SCALE, profile=profile, broker=EMBEDDED) as sn,
        listening(sn.topology.broker or "") as events,
    ):
        clients = sn.clients
        devices = {d.id for d in sn.topology.devices}
        before = await incidents(clients)()
        fault = await faults.inject(clients, "service-partition", "manager")
        assert fault.kind == "service-partition" and fault.target == "manager"
        with pytest.raises(grpc.aio.AioRpcError) as unanswered:  # its packets are dropped
            await clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest(), timeout=1.0)
        assert unanswered.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        start = await _emulated_s(clients)
        await until(lambda: _emulated_s(clients), lambda now: now >= start + SILENT_S)
        if guarded:
            await events.wait_for(lambda: events.named("manager", "cut-off"))
        await faults.clear(clients, fault.id)
        after = await until(incidents(clients), lambda _: True)  # it answers again
        opened = {i.device for i in after} - {i.device for i in before}
        if guarded:
            assert not opened, opened
            (cut,) = events.named("manager", "cut-off")
            assert int(cut["devices_silent"]) == len(devices)  # one process: one stream
            await events.wait_for(lambda: events.named("manager", "rejoined"))
        else:
            assert devices <= opened, devices - opened  # every healthy device failed
            assert not events.named("manager", "cut-off")
