"""A start's `started` events reach the broker before the start returns (issue 18).

Published after the start had returned, cm384's 629 `started` events (QoS 1, one acknowledgement
each, through the embedded broker on the event loop that serves every device) kept that loop busy
for the first 0.5-1 s of service, where the first paced fabric transfers met them: traced, 408 of
the 629 acknowledgements came while the pacing benchmark's transfers ran. A start now waits for
them (EventBus.sent), bounded, and never for a broker that is away or does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.runtime import events as events_module
from cmemu.emulator.runtime import inprocess
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.events import EventBus
from cmemu.emulator.testing import MINI_SERVERS, free_port_block, running_supernode
from tests.runtime.test_mqtt import listening

HANG_BOUND_S = 60.0  # bounds a test whose wait never ends (it fails instead of hanging)


class SilentBroker:
    """An MQTT broker that accepts a connection (CONNACK) and then never answers again: a
    broker that hangs, as a publisher meets it. It counts the PUBLISH packets it was sent."""

    def __init__(self) -> None:
        self.published = 0
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                header = await reader.readexactly(1)
                length, shift = 0, 0
                while True:  # the remaining length: a varint of 7-bit groups
                    byte = (await reader.readexactly(1))[0]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                await reader.readexactly(length)
            except asyncio.IncompleteReadError:
                return
            if first:  # the CONNECT: accepted
                first = False
                writer.write(bytes([0x20, 0x02, 0x00, 0x00]))
                await writer.drain()
            elif header[0] >> 4 == 3:  # a PUBLISH, never acknowledged
                self.published += 1


@contextlib.asynccontextmanager
async def silent_broker() -> AsyncIterator[SilentBroker]:
    broker = SilentBroker()
    server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
    broker.url = f"mqtt://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield broker
    finally:
        server.close()


async def _connected(bus: EventBus) -> None:
    async with asyncio.timeout(HANG_BOUND_S):
        while not bus.connected:  # noqa: ASYNC110 (the bus has no event for its connection)
            await asyncio.sleep(0.01)


async def test_sent_returns_once_the_broker_has_every_event() -> None:
    async with Broker() as broker, listening(broker.url) as listener:
        async with EventBus(broker.url, "sn0") as bus:
            await _connected(bus)
            for i in range(50):
                bus.event(f"dev{i}", "started", i)
            assert bus.pending == 50
            async with asyncio.timeout(HANG_BOUND_S):
                assert await bus.sent(HANG_BOUND_S)
            assert bus.pending == 0
        await listener.wait_for(lambda: len(listener.events("started")) == 50)
        # several in flight at once, they still arrive in the order they were raised
        assert [p["emulated_ns"] for p in listener.events("started")] == list(range(50))


async def test_sent_does_not_wait_for_a_broker_that_is_away() -> None:
    """The twin of the above: nothing listens at the broker's address; the events stay
    buffered for later and nobody waits for them (a wait would hang the bounded block)."""
    port = free_port_block(1)
    async with EventBus(f"mqtt://127.0.0.1:{port}", "sn0") as bus:
        bus.event("dev0", "started", 0)
        async with asyncio.timeout(HANG_BOUND_S):
            assert not await bus.sent(3600.0)
        assert bus.pending == 1


async def test_sent_gives_up_on_a_broker_that_never_acknowledges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the publish in flight ends this soon after the test (the bus's exit waits for it)
    monkeypatch.setattr(events_module, "PUBLISH_TIMEOUT_S", 0.5)
    async with silent_broker() as broker, EventBus(broker.url, "sn0") as bus:
        await _connected(bus)
        bus.event("dev0", "started", 0)
        async with asyncio.timeout(HANG_BOUND_S):
            assert not await bus.sent(0.2)  # the bound ends the wait, not an answer
        assert bus.pending == 1


async def test_a_start_returns_with_its_started_events_at_the_broker() -> None:
    async with Broker() as broker, running_supernode("cm-mini", broker=broker.url) as sn:
        bus = sn.local.events
        assert bus is not None and bus.connected
        assert bus.pending == 0  # all MINI_SERVERS of them acknowledged before the start returned


async def test_a_start_does_not_wait_for_a_broker_that_is_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin: the start's wait, however long it may be, is not spent on a broker that is
    away; the started events stay buffered for when it comes."""
    monkeypatch.setattr(inprocess, "ANNOUNCE_WAIT_S", 3600.0)
    port = free_port_block(1)
    async with asyncio.timeout(HANG_BOUND_S * 5):
        async with running_supernode("cm-mini", broker=f"mqtt://127.0.0.1:{port}") as sn:
            bus = sn.local.events
            assert bus is not None and not bus.connected
            assert bus.pending >= MINI_SERVERS
