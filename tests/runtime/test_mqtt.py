"""Telemetry and events over MQTT, against the real mosquitto and the embedded broker."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime.broker import Broker, topic_matches
from cmemu.emulator.runtime.composegen import MOSQUITTO_QUEUES
from cmemu.emulator.runtime.events import EventBus
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import LaunchOptions
from cmemu.emulator.testing import (
    CMEMU,
    MINI_PORTS,
    MINI_SERVERS,
    Clients,
    free_port_block,
    hosted_instance,
    running_supernode,
)
from cmemu.v1 import device_pb2, fabric_pb2

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
BROKER_PORTS = 31000
SERVERS = MINI_SERVERS  # cm-mini's devices and supernode-wide services
FAST = replace(DEFAULT_PROFILE, limits=replace(DEFAULT_PROFILE.limits, telemetry_interval_s=0.2))


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@contextmanager
def mosquitto(port: int, tmp_path: Path, *, queues: str = MOSQUITTO_QUEUES) -> Iterator[str]:
    """The real broker from Debian, on a loopback port of our choosing, with the queue settings
    of compose/mosquitto.conf (or `queues` in their place)."""
    conf = tmp_path / f"mosquitto-{port}.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n{queues}")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline, "mosquitto did not listen"
            time.sleep(0.05)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@asynccontextmanager
async def broker(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    if kind == "embedded":
        async with Broker() as embedded:
            yield embedded.url
    else:
        with mosquitto(free_port_block(1, start=BROKER_PORTS), tmp_path) as url:
            yield url


class Listener:
    """A subscriber that collects every message of the supernode."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._arrived = asyncio.Event()

    async def run(
        self, url: str, ready: asyncio.Event, login: Mapping[str, str] | None = None
    ) -> None:
        host, port = url.removeprefix("mqtt://").split(":")
        login = login or {}
        user, password = login.get("username"), login.get("password")
        async with aiomqtt.Client(host, int(port), username=user, password=password) as client:
            await client.subscribe("cmemu/#", qos=1)
            ready.set()
            async for message in client.messages:
                raw = message.payload
                assert isinstance(raw, bytes)
                self.messages.append((str(message.topic), json.loads(raw)))
                self._arrived.set()

    def events(self, event: str) -> list[dict[str, Any]]:
        return [p for t, p in self.messages if t.endswith("/events") and p["event"] == event]

    def named(self, source: str, event: str) -> list[dict[str, Any]]:
        """The `event` events of one source (a device or a service: its topic level)."""
        return [p for p in self.events(event) if p["device"] == source]

    async def wait_for(self, check: Any, within_s: float = 60.0) -> None:  # bounds a hung test
        async with asyncio.timeout(within_s):
            while not check():
                self._arrived.clear()
                await self._arrived.wait()


@asynccontextmanager
async def listening(url: str, login: Mapping[str, str] | None = None) -> AsyncIterator[Listener]:
    """A Listener subscribed to everything, logged in with `login` (a supernode's
    `security.mqtt_login()`) when the broker wants one."""
    listener = Listener()
    ready = asyncio.Event()
    task = asyncio.ensure_future(listener.run(url, ready, login))
    async with asyncio.timeout(10):
        await ready.wait()
    try:
        yield listener
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_topic_filters() -> None:
    assert topic_matches("cmemu/+/+/events", "cmemu/sn0/n00-npu0/events")
    assert not topic_matches("cmemu/+/+/events", "cmemu/sn0/n00-npu0/telemetry")
    assert topic_matches("cmemu/#", "cmemu/sn0/x/events")
    assert topic_matches("cmemu/sn0/#", "cmemu/sn0")
    assert not topic_matches("cmemu/+", "cmemu/a/b")


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
async def test_events_and_telemetry_reach_the_broker(kind: str, tmp_path: Path) -> None:
    async with broker(kind, tmp_path) as url, listening(url) as listener:
        async with running_supernode("cm-mini", profile=FAST, broker=url) as supernode:
            await listener.wait_for(lambda: len(listener.events("started")) == SERVERS)
            started = listener.events("started")
            topology = supernode.topology
            servers = {d.id for d in topology.devices} | {x.id for x in topology.services}
            assert {p["device"] for p in started} == servers
            assert all(p["status"] == "SERVING" for p in started)
            await listener.wait_for(
                lambda: any(t == "cmemu/sn0/n01-mem/telemetry" for t, _ in listener.messages)
            )
            sample = next(p for t, p in listener.messages if t == "cmemu/sn0/n01-mem/telemetry")
            assert sample["device"] == "n01-mem" and "memory_capacity_bytes" in sample

            clients = Clients(supernode.topology)
            await clients.device("n00-cpu2").SetFaultState(
                device_pb2.FaultState(faulted=True, reason="thermal trip")
            )
            await listener.wait_for(lambda: bool(listener.events("fault")))
            fault = listener.events("fault")[0]
            assert (fault["device"], fault["reason"]) == ("n00-cpu2", "thermal trip")
            await listener.wait_for(lambda: bool(listener.events("health")))
            assert listener.events("health")[0]["status"] == "NOT_SERVING"
            await clients.fabric().InjectFault(
                fabric_pb2.FabricFault(kind="switch-down", target="n01-l1s3")
            )
            await listener.wait_for(
                lambda: any(p["device"] == "fabric" for p in listener.events("fault"))
            )
            switch = next(p for p in listener.events("fault") if p["device"] == "fabric")
            assert (switch["kind"], switch["target"]) == ("switch-down", "n01-l1s3")
            telemetry = await clients.device("n00-cpu2").GetTelemetry(
                device_pb2.GetTelemetryRequest()
            )
            assert telemetry.broker_connected and telemetry.faulted
            await clients.close()
        await listener.wait_for(lambda: len(listener.events("stopped")) == SERVERS)


async def test_a_broker_that_is_down_costs_nothing_and_loses_nothing(tmp_path: Path) -> None:
    port = free_port_block(1, start=BROKER_PORTS)  # apart from the supernode's own block
    url = f"mqtt://127.0.0.1:{port}"
    async with running_supernode("cm-mini", broker=url) as supernode:  # nothing listens there
        clients = Clients(supernode.topology)
        telemetry = await clients.device("n00-npu0").GetTelemetry(device_pb2.GetTelemetryRequest())
        assert not telemetry.broker_connected
        assert telemetry.events_pending >= SERVERS  # the started events, kept for later
        await clients.device("n00-npu0").SetFaultState(device_pb2.FaultState(faulted=True))
        await clients.device("n00-npu0").SetFaultState(device_pb2.FaultState(faulted=False))
        assert await clients.health("n00-npu0") == "SERVING"
        # The publisher retries at 0, 0.2, 0.6, 1.4 and 3.0 s: the broker comes back at 2.5 s and
        # the listener subscribes before the publisher's next try.
        await asyncio.sleep(2.5)
        with mosquitto(port, tmp_path):
            async with listening(url) as listener:
                await listener.wait_for(
                    lambda: len(listener.events("started")) == SERVERS, within_s=20
                )
                await listener.wait_for(lambda: bool(listener.events("recovered")))
                # the cluster manager and the scheduler react to the fault too: their events
                # follow the device's, so the queue drains a little later
                deadline = asyncio.get_running_loop().time() + 20
                while True:
                    after = await clients.device("n00-npu0").GetTelemetry(
                        device_pb2.GetTelemetryRequest()
                    )
                    if after.events_pending == 0:
                        break
                    assert asyncio.get_running_loop().time() < deadline, after
                    await asyncio.sleep(0.1)
            assert (
                after.broker_connected and after.events_pending == 0 and after.events_dropped == 0
            )
        await clients.close()


async def test_a_bad_broker_url_is_refused() -> None:
    with pytest.raises(Exception, match="mqtt://HOST:PORT"):
        async with running_supernode("cm-mini", broker="http://example"):
            pass


def test_cmemu_watch_prints_live_events(tmp_path: Path) -> None:
    cmemu = CMEMU
    state_file = tmp_path / "state.json"
    base = free_port_block(MINI_PORTS)
    # hosted here, its embedded broker too: `cmemu watch` attaches by the state file
    options = LaunchOptions(preset="cm-mini", mode=InProcess(plan=PortPlan(base_port=base)))
    with hosted_instance(options, state_file, timeout_s=120.0):
        watch = subprocess.Popen(
            [
                cmemu,
                "watch",
                "--state-file",
                str(state_file),
                "--device",
                "n01-*",
                "--count",
                "2",
                "--ready",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert watch.stdout is not None and watch.stdout.readline().strip() == "watching"
        grpcurl = str(Path(sys.executable).parent / "grpcurl")
        for device in ("n00-npu1", "n01-npu1"):  # only the second matches the glob
            address = f"127.0.0.1:{base + (1 if device == 'n00-npu1' else 14)}"
            subprocess.run(
                [
                    grpcurl,
                    "-plaintext",
                    "-d",
                    '{"faulted": true, "reason": "watch me"}',
                    address,
                    "cmemu.v1.Device/SetFaultState",
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
        out, _ = watch.communicate(timeout=30)
        assert watch.returncode == 0
        lines = out.strip().splitlines()
        assert len(lines) == 2 and all("n01-npu1" in line for line in lines)
        assert "fault" in lines[0] and "reason=watch me" in lines[0]
    gone = subprocess.run(
        [cmemu, "watch", "--state-file", str(state_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert gone.returncode == 1 and "no running emulator" in gone.stderr


async def test_telemetry_never_takes_an_events_place_in_the_buffer() -> None:
    """A lagging publisher holds the newest sample per device, apart from the bounded event
    buffer: a burst of telemetry neither drops an event nor queues stale samples."""
    async with Broker() as embedded, listening(embedded.url) as listener:

        def samples() -> list[int]:
            return [p["i"] for t, p in listener.messages if t.endswith("/telemetry")]

        async with EventBus(embedded.url, "sn0", buffer_max=5) as bus:
            bus.event("dev0", "hello", 0)  # once it arrives, the bus is connected
            await listener.wait_for(lambda: len(listener.events("hello")) == 1)
            assert bus.connected
            for i in range(300):  # no await in between: the publisher cannot run
                bus.telemetry(f"dev{i % 3}", {"i": i})
            for i in range(5):
                bus.event("dev0", "fault", i)
            assert bus.dropped == 0
            await listener.wait_for(lambda: len(listener.events("fault")) == 5)
            await listener.wait_for(lambda: len(samples()) == 3)
        assert sorted(samples()) == [297, 298, 299]  # the newest of each device only
        assert [p["emulated_ns"] for p in listener.events("fault")] == [0, 1, 2, 3, 4]
