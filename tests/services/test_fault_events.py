"""Every fault injection and clearance is an MQTT event with emulated timestamps, and a broker
outage is one the devices live through: they buffer their events and send them when it ends.
Real servers, the embedded broker and a real subscriber."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2
from tests.runtime.test_mqtt import listening


async def test_faults_and_clearances_are_events_and_an_outage_buffers_them() -> None:
    async with (
        Broker() as broker,
        listening(broker.url) as listener,
        running_supernode("cm-mini", time_scale=10.0, broker=broker.url) as supernode,
    ):
        clients = Clients(supernode.topology)
        crash = await faults.inject(clients, "crash", "n00-npu3", duration_s=2.0)

        def of(event: str, device: str) -> list[dict[str, object]]:
            return [p for p in listener.events(event) if p["device"] == device]

        await listener.wait_for(lambda: bool(of("fault-cleared", "n00-npu3")))
        fault, cleared = of("fault", "n00-npu3")[0], of("fault-cleared", "n00-npu3")[0]
        assert fault["fault"] == "crash" and fault["until_ns"] == crash.until_ns
        assert cleared["expired"] is True
        assert isinstance(fault["emulated_ns"], int) and isinstance(cleared["emulated_ns"], int)
        assert cleared["emulated_ns"] >= crash.until_ns  # cleared by the emulated clock

        outage = await faults.inject(clients, "broker-outage")
        assert outage.id == "broker"
        stub = clients.device("n00-npu0")
        telemetry = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())
        assert not telemetry.broker_connected
        await faults.inject(clients, "hang", "n01-npu2")
        await faults.clear(clients, "dev:n01-npu2:hang")
        pending = (await stub.GetTelemetry(device_pb2.GetTelemetryRequest())).events_pending
        assert pending >= 2  # the hang's fault and fault-cleared wait for the broker
        assert not of("fault", "n01-npu2")
        await faults.clear(clients, outage.id)
        await listener.wait_for(lambda: bool(of("fault-cleared", "n01-npu2")))

        async def drained() -> bool:
            t = await stub.GetTelemetry(device_pb2.GetTelemetryRequest())
            return t.broker_connected and t.events_pending == 0 and t.events_dropped == 0

        async with asyncio.timeout(20):
            while not await drained():  # noqa: ASYNC110 (polled over gRPC, as a client does)
                await asyncio.sleep(0.05)
        await clients.close()


@pytest.mark.slow
async def test_a_broker_outage_with_a_dead_process_goes_in_once(tmp_path: Path) -> None:
    """Issue 21, finding 8: with the node process that hosts the first devices dead, each of
    its devices was looked up through a live process, which was then picked once per dead
    device: the second injection there failed FAULT_ALREADY_ACTIVE after the first went in."""
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=47), run_dir=tmp_path / "run"),
    )
    async with Supernode.start(options) as sn:
        assert sn.supervisor is not None and sn.broker is not None
        dead = sn.supervisor.running["n00"].proc
        dead.send_signal(signal.SIGKILL)
        async with asyncio.timeout(30):
            await dead.wait()
        clients = Clients(sn.topology)
        outage = await faults.inject(clients, "broker-outage")
        assert (outage.id, outage.detail) == ("broker", "1 processes cut off")
        stub = clients.device("n01-npu0")
        assert not (await stub.GetTelemetry(device_pb2.GetTelemetryRequest())).broker_connected
        listed = await stub.ListFaults(device_pb2.ListDeviceFaultsRequest(process=True))
        assert [f.kind for f in listed.faults] == ["broker-outage"]  # on one device, once
        await faults.clear(clients, outage.id)
        with pytest.raises(NotFoundError):  # nothing is left active
            await faults.clear(clients, outage.id)
        await clients.close()


async def test_a_skewed_devices_events_carry_its_skewed_stamps() -> None:
    """clock-skew: what `cmemu watch` shows of a device whose clock is 30 s ahead is stamped
    30 s ahead of the true time (another device's reading, taken around it)."""
    async with (
        Broker() as broker,
        listening(broker.url) as listener,
        running_supernode("cm-mini", time_scale=10.0, broker=broker.url) as supernode,
    ):
        clients = Clients(supernode.topology)
        witness = clients.device("n00-npu0")

        async def true_ns() -> int:
            return (await witness.GetTelemetry(device_pb2.GetTelemetryRequest())).emulated_ns

        before = await true_ns()
        skew = await faults.inject(clients, "clock-skew", "n00-npu3", {"offset_s": 30})
        hang = await faults.inject(clients, "hang", "n00-npu3")
        after = await true_ns()

        def of(event: str) -> list[dict[str, object]]:
            return [p for p in listener.events(event) if p["device"] == "n00-npu3"]

        await listener.wait_for(lambda: any(e["fault"] == "hang" for e in of("fault")))
        stamped = next(e for e in of("fault") if e["fault"] == "hang")["emulated_ns"]
        assert isinstance(stamped, int)
        assert before + 30 * 10**9 <= stamped <= after + 30 * 10**9
        await faults.clear(clients, hang.id)
        await faults.clear(clients, skew.id)
        await clients.close()
