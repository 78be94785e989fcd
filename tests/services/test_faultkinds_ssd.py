"""ssd-loss through real gRPC against one in-process cm-mini whose EMS holds 12 KiB per pool
and 4 KiB of SSD (one 4 KiB object), with the embedded MQTT broker: the object EMS demoted to
SSD is gone with the drives, the objects in the pools are untouched, evictions drop instead of
demoting while the tier is lost, and new drives (the clear) take demotions again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import ems_pb2, ems_pb2_grpc
from tests.runtime.test_mqtt import listening
from tests.services.test_faultkinds import _refused

KIB = 1024
PAGE = 4 * KIB
POOL_BYTES = DEFAULT_PROFILE.node.cpus * DEFAULT_PROFILE.cpu.pooled_bytes
SMALL = replace(
    DEFAULT_PROFILE,
    ems=replace(DEFAULT_PROFILE.ems, dram_share=12 * KIB / POOL_BYTES, ssd_bytes_per_node=2 * KIB),
)


@pytest.fixture(scope="module")
async def broker() -> AsyncIterator[Broker]:
    async with Broker() as running:
        yield running


@pytest.fixture(scope="module")
async def mini(broker: Broker) -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", profile=SMALL, broker=broker.url) as sn:
        yield sn


def _ems(clients: Clients) -> ems_pb2_grpc.EmsAsyncStub:
    address = clients.topology.service(ServiceKind.EMS).address
    return ems_pb2_grpc.EmsStub(clients.channel_to(address))


async def _tier(ems: ems_pb2_grpc.EmsAsyncStub, key: str) -> int:
    return int((await ems.Exists(ems_pb2.ExistsRequest(key=key))).tier)


async def test_ssd_loss_takes_what_only_the_ssd_held(clients: Clients, broker: Broker) -> None:
    ems = _ems(clients)
    for key in ("a", "b", "c"):
        await ems.Put(ems_pb2.PutRequest(key=key, data=key.encode() * PAGE))
    await ems.Get(ems_pb2.GetRequest(key="a"))  # b is now the least recently used
    await ems.Put(ems_pb2.PutRequest(key="d", data=b"d" * PAGE))  # evicts b to the SSD
    assert await _tier(ems, "b") == ems_pb2.TIER_SSD
    async with listening(broker.url) as listener:
        fault = await faults.inject(clients, "ssd-loss", "ems")
        assert (fault.kind, fault.target) == ("ssd-loss", "ems")
        assert fault.id in {f.id for f in await faults.list_all(clients)}
        await listener.wait_for(lambda: bool(listener.events("ssd-lost")))
        (lost,) = listener.events("ssd-lost")
        assert (lost["device"], lost["objects"], lost["bytes"]) == ("ems", 1, PAGE)
        gone = await _refused(ems.Get(ems_pb2.GetRequest(key="b")))
        assert gone.code is grpc.StatusCode.NOT_FOUND
        for key in ("a", "c", "d"):  # the pools' objects: untouched
            got = await ems.Get(ems_pb2.GetRequest(key=key))
            assert got.data == key.encode() * PAGE and got.tier == ems_pb2.TIER_DRAM
        stat = await ems.Stat(ems_pb2.StatRequest())
        assert (stat.ssd_objects, stat.ssd_used_bytes) == (0, 0)
        await ems.Put(ems_pb2.PutRequest(key="e", data=b"e" * PAGE))  # evicts a: dropped
        assert not (await ems.Exists(ems_pb2.ExistsRequest(key="a"))).exists
        assert (await ems.Stat(ems_pb2.StatRequest())).ssd_objects == 0
        await faults.clear(clients, fault.id)  # new drives
        await listener.wait_for(lambda: bool(listener.events("ssd-replaced")))
    await ems.Put(ems_pb2.PutRequest(key="f", data=b"f" * PAGE))  # evicts c: to SSD again
    assert await _tier(ems, "c") == ems_pb2.TIER_SSD
    assert (await ems.Get(ems_pb2.GetRequest(key="c"))).data == b"c" * PAGE
    assert fault.id not in {f.id for f in await faults.list_all(clients)}


async def test_ssd_loss_names_the_ems(clients: Clients) -> None:
    with pytest.raises(InvalidArgumentError, match="its target is the ems service") as err:
        await faults.inject(clients, "ssd-loss", "manager")
    assert (err.value.field, err.value.reason) == ("target", "NOT_EMS")
    with pytest.raises(NotFoundError, match="no service 'sn3-ems'"):
        await faults.inject(clients, "ssd-loss", "sn3-ems")
    with pytest.raises(InvalidArgumentError, match="unknown parameter 'drives'"):
        await faults.inject(clients, "ssd-loss", "ems", {"drives": "2"})
    with pytest.raises(InvalidArgumentError, match="needs a target"):
        await faults.inject(clients, "ssd-loss", "")
    assert not [f for f in await faults.list_all(clients) if f.kind == "ssd-loss"]
