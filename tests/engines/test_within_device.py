"""A device's READ or WRITE within itself (EMS's copies, written and read by their own pool)
that has ended by the time the fabric times it is delivered once: the target's applying checks
what Deliver's check_only would, so the check is not asked apart. Its results are the two-step
path's: the bytes, the emulated completion, a completed flow counted; a bad address is refused
as before, nothing applied or counted. So is a transfer between two devices on a quiet fabric
(a flow alone across its links). The twins: an atomic within a device, and a transfer beside a
flow in flight, are still checked first and applied after (two Delivers).

"Ended by the time the fabric times it" depends on the emulated clock having moved past the
issue stamp's end: a bus stamps its transfers "now", and on a busy host the clock can hold
still between the stamp and the timing (a stall cut out of emulated time), so the tests of the
one-Deliver path give the fabric a transfer stamped an emulated millisecond back, ended whatever
the host did (CI's stress step once saw the two-step path taken under its CPU hog)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.engines.peers import LocalDevice
from cmemu.emulator.model.errors import PreconditionError, UnavailableError
from cmemu.emulator.model.ub import Completion, Op, Transaction
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[InProcessSupernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode.local


def _counting(engine: DeviceEngine, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The check_only flag of every Deliver `engine` is asked for, in order."""
    asked: list[bool] = []
    deliver = engine.bus.deliver

    def counted(tx: Transaction, check_only: bool, timed: bool = False) -> Any:
        asked.append(check_only)
        return deliver(tx, check_only, timed)

    monkeypatch.setattr(engine.bus, "deliver", counted)
    return asked


def _completed(local: InProcessSupernode) -> int:
    assert local.fabric is not None
    return local.fabric.flows.live.completed


async def _ended(
    local: InProcessSupernode, tx: Transaction, issuer: DeviceEngine | None = None
) -> Completion:
    """`tx` issued by `issuer` (its own target by default), stamped an emulated millisecond
    back: ended when timed."""
    fabric = local.fabric
    assert fabric is not None
    await fabric.clock.pace(0.01)  # a clock far enough on for a stamp a millisecond back
    stamp = fabric.clock.now_ns() - 1_000_000
    src = tx.dst_eid if issuer is None else issuer.device.eid
    stamped = dataclasses.replace(tx, src_eid=src, issue_ns=stamp)
    done = await fabric.transfer(stamped, deadline_s=None)
    assert done.issue_ns == stamp  # the stamp kept: the path under test is the one taken
    return done


async def test_a_read_and_a_write_within_a_device_are_delivered_once(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = local.devices["n00-mem"]
    asked = _counting(pool, monkeypatch)
    region = pool.allocate(4096, "within")
    data = bytes(range(256)) * 4
    before = _completed(local)
    write = Transaction(op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=region.offset, data=data)
    wrote = await _ended(local, write)
    read = Transaction(op=Op.READ, dst_eid=pool.device.eid, dst_offset=region.offset, size=1024)
    got = await _ended(local, read)
    assert got.data == data
    assert asked == [False, False]  # applied once each, never asked to check apart
    assert _completed(local) == before + 2
    for done in (wrote, got):
        assert done.path == (pool.device.id,)
        assert done.complete_ns > done.issue_ns > 0  # the route's latency, and the bytes


async def test_a_bad_address_within_a_device_is_refused_with_nothing_counted(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = local.devices["n00-mem"]
    asked = _counting(pool, monkeypatch)
    before = _completed(local)
    stray = Transaction(op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=1 << 20, data=b"x" * 8)
    with pytest.raises(PreconditionError):
        await _ended(local, stray)
    assert asked == [False] and _completed(local) == before
    assert pool.memory.store.read(1 << 20, 8) == bytes(8)  # nothing written


async def test_an_atomic_within_a_device_is_checked_then_applied(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin: an atomic's applying checks more than its check (room for a page)."""
    pool = local.devices["n00-mem"]
    asked = _counting(pool, monkeypatch)
    region = pool.allocate(4096, "twin")
    tx = Transaction(op=Op.FETCH_ADD, dst_eid=pool.device.eid, dst_offset=region.offset, operand=1)
    await pool.bus.submit(tx, None)
    assert asked == [True, False]


async def test_a_write_between_devices_on_a_quiet_fabric_is_delivered_once(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow alone across links (nothing else in flight) that has ended is answered as one
    within a device is: applied once, counted once, timed across its links."""
    pool = local.devices["n00-mem"]
    asked = _counting(pool, monkeypatch)
    region = pool.allocate(4096, "quiet")
    before = _completed(local)
    tx = Transaction(op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=region.offset, data=b"q" * 64)
    done = await _ended(local, tx, issuer=local.devices["n00-npu0"])
    assert asked == [False] and _completed(local) == before + 1
    assert len(done.path) > 1 and done.complete_ns > done.issue_ns  # across links, timed
    assert pool.memory.store.read(region.offset, 64) == b"q" * 64


async def test_a_write_beside_a_flow_in_flight_is_checked_then_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The twin of the quiet fabric: with another flow in flight, a transfer between devices
    may share its links, so it is checked, run as a flow, then applied (two Delivers). Its own
    supernode: the flow in flight is failed by that supernode's stop, as any left running."""
    async with running_supernode("cm-mini") as supernode:
        local = supernode.local
        fabric = local.fabric
        assert fabric is not None
        route = fabric.route("n00-npu1", "n00-mem")
        hog = asyncio.create_task(fabric.run_flow(route, 10**18, fabric.flows.now_s()))
        try:
            await asyncio.sleep(0)  # its flow is in flight: an exabyte, for the whole test
            assert fabric.flows.live.flows
            pool = local.devices["n00-mem"]
            asked = _counting(pool, monkeypatch)
            region = pool.allocate(4096, "beside")
            eid, offset = pool.device.eid, region.offset
            tx = Transaction(op=Op.WRITE, dst_eid=eid, dst_offset=offset, data=b"b")
            await _ended(local, tx, issuer=local.devices["n00-npu0"])
            assert asked == [True, False]
        finally:
            hog.cancel()


@pytest.mark.parametrize("gate", ["open", "crashed", "hung"])
async def test_an_allocation_through_an_open_gate_answers_at_its_first_step(
    local: InProcessSupernode, gate: str
) -> None:
    """EMS's allocations and frees call a pool of this process directly through its open gate
    (answered at the first step: the coroutine never suspends); the twins: a crashed pool
    refuses as its server would (UNAVAILABLE, its id prefixed) and a hung one never answers."""
    pool = local.devices["n00-mem"]
    peer = LocalDevice(pool)
    effects = pool.effects
    try:
        effects.crashed = gate == "crashed"
        if gate == "hung":
            effects.answering.clear()
        call = peer.allocate(4096, "gate", deadline_s=None)
        try:
            call.send(None)
        except StopIteration as answered:
            region = answered.value
            assert gate == "open" and region.size == 4096
            freeing = peer.free(region.region_id, deadline_s=None)
            with pytest.raises(StopIteration):
                freeing.send(None)
        except UnavailableError as exc:
            assert gate == "crashed" and str(exc).startswith("n00-mem: ")
        else:
            assert gate == "hung"  # waiting at the gate
            call.close()
    finally:
        effects.crashed = False
        effects.answering.set()
