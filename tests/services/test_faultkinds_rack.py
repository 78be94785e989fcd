"""rack-power-off through real gRPC against one in-process cm-mini whose racks hold one node
each (nodes_per_rack=1: rack00 is n00, rack01 is n01), so one rack fails beside one that stands:
every device of the rack's node crashes, the manager raises an incident for each of its NPUs,
the other rack's devices answer and have none, and one id clears it all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, manager_pb2
from tests.services.test_faultkinds import _ids, _refused, _until

ONE_NODE_RACKS = replace(DEFAULT_PROFILE, node=replace(DEFAULT_PROFILE.node, nodes_per_rack=1))


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=10.0, profile=ONE_NODE_RACKS) as sn:
        yield sn


async def _incident_devices(clients: Clients) -> set[str]:
    listed = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
    return {i.device for i in listed.incidents}


async def test_a_rack_power_off_crashes_its_nodes_and_the_manager_sees_each_npu(
    clients: Clients,
) -> None:
    assert clients.topology.nodes_per_rack == 1
    rack = [d.id for d in clients.topology.devices if d.node == "n01"]
    npus = [d for d in rack if "-npu" in d]
    fault = await faults.inject(clients, "rack-power-off", "rack01")
    assert (fault.id, fault.kind, fault.target) == ("rack:rack01", "rack-power-off", "rack01")
    assert f"{len(rack)} devices of 1 nodes crashed" in fault.detail
    assert {f"dev:{d}:crash" for d in rack} <= await _ids(clients)
    for device in (rack[0], rack[-1]):
        gone = await _refused(clients.device(device).GetInfo(device_pb2.GetInfoRequest()))
        assert gone.code is grpc.StatusCode.UNAVAILABLE

    async def seen() -> bool:
        return set(npus) <= await _incident_devices(clients)

    await _until(seen)  # the manager raised an incident for every NPU of the rack
    incidents = await _incident_devices(clients)
    assert not any(d.startswith("n00-") for d in incidents)  # the other rack: none
    assert (await clients.device("n00-npu0").GetInfo(device_pb2.GetInfoRequest())).id == "n00-npu0"
    assert not any(i.startswith("dev:n00-") for i in await _ids(clients))

    await faults.clear(clients, fault.id)  # one id clears every device of the rack
    for device in rack:
        await clients.device(device).GetInfo(
            device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=30
        )
    assert not any(i.startswith("dev:n01-") for i in await _ids(clients))
    with pytest.raises(NotFoundError):
        await faults.clear(clients, fault.id)


async def test_a_rack_power_off_names_a_rack_that_exists(clients: Clients) -> None:
    with pytest.raises(NotFoundError, match=r"no rack 'rack02' in sn0 \(its 2: rack00, rack01"):
        await faults.inject(clients, "rack-power-off", "rack02")
    for malformed in ("rack1", "r01", "n01", "sn0-rack00"):
        with pytest.raises(InvalidArgumentError, match="not a valid rack id"):
            await faults.inject(clients, "rack-power-off", malformed)
    with pytest.raises(InvalidArgumentError, match="parameter wipe must be true or false") as err:
        await faults.inject(clients, "rack-power-off", "rack00", {"wipe": "maybe"})
    assert err.value.field == "params.wipe"
    with pytest.raises(InvalidArgumentError, match="needs a target"):
        await faults.inject(clients, "rack-power-off", "")
    assert not await _ids(clients)  # nothing was crashed by a refused injection


async def test_a_rack_power_off_is_all_or_nothing(clients: Clients) -> None:
    held = await faults.inject(clients, "crash", "n01-npu2")
    busy = await _refused(faults.inject(clients, "rack-power-off", "rack01"))
    assert (busy.code, busy.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "FAULT_ALREADY_ACTIVE")
    # the devices it took down came back: only the crash held before stays (and its rank-down)
    assert {i for i in await _ids(clients) if i.startswith("dev:")} == {held.id}
    await clients.device("n01-npu0").GetInfo(
        device_pb2.GetInfoRequest(), wait_for_ready=True, timeout=30
    )
    await faults.clear(clients, held.id)
