"""The web view's device feeds from either source (emulator/runtime/webview/sources.py): in one
process the servers' own health state and the engines' telemetry, read directly (no Watch
stream, no call, no socket: issue 18's 624 streams held the first transfers' replies late after
a cm384 boot); from other processes a Watch stream per device and calls. Both must show the
same story on /api/snapshot: every NPU's telemetry, a device-down NOT_SERVING with its reason, a
crash UNREACHABLE, both SERVING again once cleared and counted as recoveries, while a hang and a
die down leave the server's health as it was."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cmemu.emulator.client import faults, h2async
from cmemu.emulator.engines.device.engine import FaultState, Telemetry
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.errors import DeadlineExceededError, UnavailableError
from cmemu.emulator.model.naming import DeviceKind
from cmemu.emulator.runtime import instance
from cmemu.emulator.runtime.instance import view_source
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.runtime.webview import WebView
from cmemu.emulator.runtime.webview.snapshot import Json
from cmemu.emulator.runtime.webview.sources import LOCAL, WIRE, LocalDevices, WireDevices
from cmemu.emulator.testing import MINI_PORTS, free_port_block, running_supernode
from cmemu.services.host import ServiceHost

WAIT_S = 30.0  # a generous bound for what must come (never a timing assertion)
MISSED_S = 2.0  # the must-fail twin: how long it waits for what never comes
DOWN, HUNG, DIE, CRASHED = "n00-npu1", "n00-npu2", "n00-npu3", "n01-npu4"


@dataclasses.dataclass
class Wire:
    """What went over the network to the devices: the addresses Watch streams were opened to
    (h2async.watch, the wire source's sockets), the devices asked for telemetry or a fault
    state (the wire source's calls)."""

    watches: list[str] = dataclasses.field(default_factory=list)
    calls: list[str] = dataclasses.field(default_factory=list)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    seen = Wire()
    watch, telemetry, fault_state = h2async.watch, WireDevices.telemetry, WireDevices.fault_state

    def watched(address: str, *args: Any, **kwargs: Any) -> AsyncGenerator[int, None]:
        seen.watches.append(address)
        return watch(address, *args, **kwargs)

    async def asked_telemetry(self: WireDevices, device: str, *, deadline_s: float) -> Telemetry:
        seen.calls.append(device)
        return await telemetry(self, device, deadline_s=deadline_s)

    async def asked_state(self: WireDevices, device: str, *, deadline_s: float) -> FaultState:
        seen.calls.append(device)
        return await fault_state(self, device, deadline_s=deadline_s)

    monkeypatch.setattr(h2async, "watch", watched)
    monkeypatch.setattr(WireDevices, "telemetry", asked_telemetry)
    monkeypatch.setattr(WireDevices, "fault_state", asked_state)
    return seen


async def _until(view: WebView, ok: Callable[[Json], bool], wait_s: float) -> Json:
    """The snapshot once `ok` holds of it; AssertionError with the last one if it never does."""
    doc: Json = {}
    async with aiohttp.ClientSession() as session:
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    async with session.get(view.url + "api/snapshot") as response:
                        doc = await response.json()
                    if ok(doc):
                        return doc
                    await asyncio.sleep(0.05)
        except TimeoutError:
            shown = {d: doc.get("devices", {}).get(d) for d in (DOWN, HUNG, DIE, CRASHED)}
            raise AssertionError(f"the view never showed it; it shows {shown}") from None


def _health(doc: Json, device: str) -> str:
    health: str = doc["devices"][device]["health"]
    return health


async def _story(sn: Supernode, view: WebView, *, wait_s: float = WAIT_S) -> Json:
    """Faults through the public API, each seen on /api/snapshot; the last snapshot."""
    clients = sn.clients
    every = [d.id for d in sn.topology.devices]
    npus = [d.id for d in sn.topology.of_kind(DeviceKind.NPU)]
    await _until(view, lambda doc: all(_health(doc, d) == "SERVING" for d in every), wait_s)
    await _until(view, lambda doc: all(doc["devices"][d].get("hbm_capacity") for d in npus), wait_s)
    hang = await faults.inject(clients, "hang", HUNG)
    die = await faults.inject(clients, "die-down", DIE, {"die": 1})
    down = await faults.inject(clients, "device-down", DOWN, {"reason": "pulled"})
    doc = await _until(view, lambda doc: _health(doc, DOWN) == "NOT_SERVING", wait_s)
    await _until(view, lambda doc: doc["devices"][DOWN].get("reason") == "pulled", wait_s)
    crash = await faults.inject(clients, "crash", CRASHED)
    doc = await _until(view, lambda doc: _health(doc, CRASHED) == "UNREACHABLE", wait_s)
    # what came after the hang and the die-down is shown: they changed nothing of the health
    assert _health(doc, HUNG) == _health(doc, DIE) == "SERVING"
    assert doc["recovery"]["down_now"] == 2
    for fault in (crash, down, hang, die):
        await faults.clear(clients, fault.id)
    doc = await _until(
        view, lambda doc: all(_health(doc, d) == "SERVING" for d in (DOWN, CRASHED)), wait_s
    )
    assert doc["devices"][DOWN]["reason"] == ""
    assert doc["recovery"]["down_now"] == 0
    assert doc["recovery"]["recovered"] == 2
    return doc


async def test_in_process_the_view_hears_health_from_the_servers_without_a_socket(
    wire: Wire,
) -> None:
    async with running_supernode("cm-mini") as sn:
        source = view_source(sn)
        assert isinstance(source, LocalDevices)
        async with WebView(sn.clients, source=source) as view:
            doc = await _story(sn, view)
        assert doc["sources"]["health"] == LOCAL
    assert wire.watches == wire.calls == []


async def test_over_the_wire_the_same_story_through_watch_streams(wire: Wire) -> None:
    """The twin: the servers seen as from another process (procs, compose), one Watch each."""
    async with running_supernode("cm-mini") as sn:
        elsewhere = dataclasses.replace(sn, inprocess=None, inprocesses=())
        assert view_source(elsewhere) is None  # what a launcher of other processes gets
        async with WebView(sn.clients) as view:
            doc = await _story(sn, view)
        assert doc["sources"]["health"] == WIRE
    assert len(set(wire.watches)) == len(sn.topology.devices)
    assert len(wire.watches) > len(sn.topology.devices)  # the crashed device's, again after it
    assert DOWN in wire.calls  # its fault state (and every NPU's telemetry)


async def test_a_host_that_does_not_publish_its_health_leaves_the_view_blind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Must fail: the local source hears only what the hosts publish (their first health, on
    listening, but no change after it), so the story is never seen."""
    async with running_supernode("cm-mini") as sn:
        monkeypatch.setattr(ServiceHost, "_tell", lambda self: None)
        async with WebView(sn.clients, source=LocalDevices(sn.device_servers)) as view:
            with pytest.raises(AssertionError, match="never showed"):
                await _story(sn, view, wait_s=MISSED_S)
            await faults.remove_all(sn.clients)


async def test_cmemu_up_in_process_gives_its_view_the_local_source(tmp_path: Path) -> None:
    """What `cmemu up` (instance.start) hands its web view in its default mode."""
    plan = PortPlan(base_port=free_port_block(MINI_PORTS))
    options = LaunchOptions(preset="cm-mini", mode=InProcess(plan=plan), broker=NO_BROKER)
    async with instance.start(options, tmp_path / "s.json", ui="127.0.0.1:0") as hosted:
        assert hosted.view is not None
        assert isinstance(hosted.view.collector.source, LocalDevices)
        doc = await _until(hosted.view, lambda doc: "health" in doc["sources"], WAIT_S)
        assert doc["sources"]["health"] == LOCAL


async def test_the_local_source_says_nothing_of_a_device_whose_server_would_not_answer() -> None:
    """As a call would fail: no telemetry or fault state of a crashed device (no server) or a
    hung one (its gate holds calls); both again once cleared, of every other device meanwhile."""
    async with running_supernode("cm-mini") as sn:
        source = LocalDevices(sn.device_servers)
        hang = await faults.inject(sn.clients, "hang", HUNG)
        crash = await faults.inject(sn.clients, "crash", CRASHED)
        try:
            with pytest.raises(DeadlineExceededError):
                await source.telemetry(HUNG, deadline_s=1.0)
            with pytest.raises(UnavailableError):
                await source.fault_state(CRASHED, deadline_s=1.0)
            assert (await source.telemetry(DOWN, deadline_s=1.0)).device == DOWN
        finally:
            await faults.clear(sn.clients, hang.id)
            await faults.clear(sn.clients, crash.id)
        assert (await source.telemetry(HUNG, deadline_s=1.0)).device == HUNG
        assert not (await source.fault_state(CRASHED, deadline_s=1.0)).faulted
