"""A publisher hands its messages to the embedded broker of its own process, with no MQTT
connection (issue 18: cm384's 629 `started` events, each a QoS 1 round trip through a client and
the broker on one event loop, kept it busy for the first second of service). Subscribers get the
same messages in the same order as from a publisher over MQTT, which the twins are: the same
broker reached under another URL, so through a client. A broker outage still holds them."""

from __future__ import annotations

import asyncio

import pytest

from cmemu.emulator.runtime.broker import Broker, in_process
from cmemu.emulator.runtime.events import LOCAL_BATCH, EventBus
from tests.runtime.test_mqtt import listening


@pytest.mark.parametrize("local", [True, False])
async def test_events_and_samples_reach_subscribers_in_order(local: bool) -> None:
    async with Broker() as broker, listening(broker.url) as listener:
        assert in_process(broker.url) is broker
        url = broker.url if local else f"mqtt://localhost:{broker.port}"  # not this URL
        count = 3 * LOCAL_BATCH + 5  # more than one batch between two yields
        async with EventBus(url, "sn0") as bus:
            for i in range(count):
                bus.event(f"dev{i % 7}", "started", i)
            await listener.wait_for(lambda: len(listener.events("started")) == count)
            assert bus.connected and bus.pending == 0
            bus.telemetry("dev0", {"i": 1})
            await listener.wait_for(
                lambda: any(t.endswith("/telemetry") for t, _ in listener.messages)
            )
            assert broker.clients == (1 if local else 2)  # the listener, and a client or none
        assert [p["emulated_ns"] for p in listener.events("started")] == list(range(count))
    assert in_process(broker.url) is None  # a stopped broker is no one's


@pytest.mark.parametrize("local", [True, False])
async def test_an_outage_holds_the_events_until_it_ends(local: bool) -> None:
    async with Broker() as broker, listening(broker.url) as listener:
        url = broker.url if local else f"mqtt://localhost:{broker.port}"
        async with EventBus(url, "sn0") as bus:
            bus.event("dev0", "first", 0)
            await listener.wait_for(lambda: len(listener.events("first")) == 1)
            bus.hold(True)
            for i in range(5):
                bus.event("dev0", "held", i)
            async with asyncio.timeout(30):  # the publisher lets go of the broker (bounded)
                while bus.connected:  # noqa: ASYNC110 (the bus has no event for "let go")
                    await asyncio.sleep(0.01)
            assert bus.pending == 5
            assert listener.events("held") == []
            bus.hold(False)
            await listener.wait_for(lambda: len(listener.events("held")) == 5)
        assert [p["emulated_ns"] for p in listener.events("held")] == [0, 1, 2, 3, 4]
