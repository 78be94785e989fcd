"""A gateway as its peers call it (emulator/engines/peers.py GatewayPeer): the engine of this
process (`LocalGateway`) and the typed gRPC client (`RemoteGateway`) give the same answers in
domain types and the same refusals (class, reason, message, field, id), a down gateway's
included, which is what lets a gateway's engine not know where the others live."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.gateway import RemoteGateway
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.gateway.engine import GatewayEngine
from cmemu.emulator.engines.gateway.local import LocalGateway
from cmemu.emulator.engines.gateway.types import GATEWAY_DOWN, QpState
from cmemu.emulator.engines.peers import GatewayPeer
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, UnavailableError
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.testing import free_port_block
from cmemu.services.gateway import create_gateway
from cmemu.services.peers import Peers


@dataclass
class Both:
    engine: GatewayEngine
    local: LocalGateway
    remote: RemoteGateway

    @property
    def peers(self) -> tuple[GatewayPeer, GatewayPeer]:
        return self.local, self.remote


@pytest.fixture(scope="module")
async def both() -> AsyncIterator[Both]:
    topology = build_cluster("cm-minix1")[0]
    address = f"127.0.0.1:{free_port_block(1)}"
    peers = Peers(topology)
    engine, host = create_gateway(
        address=address,
        topology=topology,
        profile=DEFAULT_PROFILE,
        clock=Timeline(Clock()),
        peers=peers,
    )
    await host.start()
    await host.set_serving(True)
    runner = asyncio.create_task(engine.run())
    channels = Channels()
    try:
        yield Both(
            engine=engine,
            local=LocalGateway(engine),
            remote=RemoteGateway(channels.get(address), engine.name),
        )
    finally:
        await engine.close()
        await runner
        await host.stop(0)
        await channels.close()
        await peers.close()


def _refusal(exc: EmulatorError) -> tuple[object, ...]:
    return (type(exc), exc.reason, str(exc), exc.field, exc.subject)


async def test_this_process_hosts_its_gateway_for_its_peers(both: Both) -> None:
    assert isinstance(both.engine.peers, Peers)
    service = both.engine.plane.gateway(0)
    assert isinstance(both.engine.peers.gateway(service), LocalGateway)


async def test_queue_pairs_connect_alike_through_either_peer(both: Both) -> None:
    for i, peer in enumerate(both.peers):
        a = await peer.create_qp(f"n00-npu{i}", 0, deadline_s=5.0)
        b = await peer.create_qp(f"n01-npu{i}", 1, deadline_s=5.0)
        assert (a.gateway, a.state, b.die) == ("sn0-gw", QpState.INIT, 1)
        connected = await peer.connect_qp(a.qpn, "sn0-gw", b.qpn, deadline_s=5.0)
        assert connected.state is QpState.RTS
        assert (connected.remote_npu, connected.remote_die) == (f"n01-npu{i}", 1)


async def test_plane_views_agree(both: Both) -> None:
    local, remote = both.peers
    routes = [await p.route("n00-npu0", "n01-npu3.d1", deadline_s=5.0) for p in both.peers]
    assert routes[0] == routes[1] and routes[0].path[0] == "n00-npu0.d0"
    stats = await remote.link_stats(3, deadline_s=5.0)
    assert stats.authority == "sn0-gw" and len(stats.links) == 3
    assert [x.link for x in stats.links] == [
        x.link for x in (await local.link_stats(3, deadline_s=5.0)).links
    ]


async def test_a_bad_request_is_refused_alike(both: Both) -> None:
    refused = []
    for peer in both.peers:
        with pytest.raises(InvalidArgumentError) as err:
            await peer.create_qp("n00-npu0", 7, deadline_s=5.0)
        refused.append(_refusal(err.value))
    assert refused[0] == refused[1]
    assert refused[0][1] == "NO_SUCH_DIE" and str(refused[0][2]).startswith("sn0-gw: ")


async def test_a_down_gateway_refuses_alike_and_keeps_its_fault_control(both: Both) -> None:
    down = await both.remote.inject_fault(
        RdmaFault(kind=GATEWAY_DOWN, params=NoParams(), target=""), deadline_s=5
    )
    try:
        assert (down.id, down.target) == ("sn0-gw-down", "sn0-gw")
        refused = []
        for peer in both.peers:
            with pytest.raises(UnavailableError) as err:
                await peer.create_qp("n00-npu2", 0, deadline_s=5.0)
            refused.append(_refusal(err.value))
            assert [f.id for f in await peer.list_faults(deadline_s=5.0)] == [down.id]
        assert refused[0] == refused[1]
        assert refused[0][1:3] == ("GATEWAY_DOWN", "sn0-gw: sn0-gw is down (fault sn0-gw-down)")
    finally:
        left = await both.local.clear_fault(down.id, all=False, deadline_s=5.0)
    assert not left and both.engine.down is None


async def test_a_plane_fault_comes_back_the_same_through_the_client(both: Both) -> None:
    slow = RdmaFault(
        kind="switch-slow", params=LinkDegradedParams(factor=0.5), target="core1", for_s=2.0
    )
    stored = await both.remote.inject_fault(slow, deadline_s=5.0)
    try:
        (held,) = await both.local.list_faults(deadline_s=5.0)
        assert held == stored and stored.id and stored.until_s == stored.since_s + 2.0
    finally:
        await both.remote.clear_fault(stored.id, all=False, deadline_s=5.0)
