"""A device's READ or WRITE within itself (EMS's copies, written and read by their own pool).

Issued through the device's own bus, it never reaches the fabric: it crosses no MatrixLink link,
so the device times it as the fabric times a local route (the same completion, checked against
the fabric's own timing of the same transfer), a fabric down does not stop it, and the fabric
counts no flow for it. An NPU's copy between its two dies crosses their die-to-die link: the
fabric's, as any transfer between devices.

Given to the fabric directly (its Transfer), a copy within a device that has ended by the time
the fabric times it is delivered once: the target's applying checks what Deliver's check_only
would, so the check is not asked apart. Its results are the two-step path's: the bytes, the
emulated completion, a completed flow counted; a bad address is refused as before, nothing
applied or counted. So is a transfer between two devices on a quiet fabric (a flow alone
across its links). The twins: an atomic within a device, and a transfer beside a flow in
flight, are still checked first and applied after (two Delivers).

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
from cmemu.emulator.model.errors import EmulatorError, PreconditionError, UnavailableError
from cmemu.emulator.model.topology import DeviceKind
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
    freed = pool.allocate(4096, "freed")  # an address no region holds, whatever ran before
    pool.free(freed.region_id)
    asked = _counting(pool, monkeypatch)
    before = _completed(local)
    stray = Transaction(op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=freed.offset, data=b"x")
    with pytest.raises(PreconditionError):
        await _ended(local, stray)
    assert asked == [False] and _completed(local) == before
    assert pool.memory.store.read(freed.offset, 1) == bytes(1)  # nothing written


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


# --- timed by the device itself: issued through its bus, the fabric is not asked ----------------


async def _own(local: InProcessSupernode, device: str, die: int, size: int) -> tuple[int, int]:
    """An address of `size` bytes in `device`'s memory (an NPU's on `die`), and its die."""
    engine = local.devices[device]
    if engine.device.kind is not DeviceKind.NPU:
        return engine.allocate(size, "own").offset, 0
    per_die = engine.profile.npu.hbm_bytes_per_die
    region = engine.allocate(per_die * die + size, "own")
    assert region.offset < per_die  # so the last `size` bytes lie on `die`
    return region.offset + per_die * die, die


@pytest.mark.parametrize(("device", "die"), [("n00-mem", 0), ("n00-cpu1", 0), ("n01-npu2", 1)])
async def test_a_copy_within_a_device_is_timed_by_it_as_the_fabric_times_it(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch, device: str, die: int
) -> None:
    """A READ or WRITE of a device's own memory (an NPU's within one die) issued through its
    bus, as EMS's copies are: applied once, no flow of the fabric counted, and completed at the
    time the fabric gives the same transfer (its local route: the copy rate, the latency)."""
    engine = local.devices[device]
    offset, die = await _own(local, device, die, 4096)
    data = bytes(range(256)) * 4
    before = _completed(local)
    asked = _counting(engine, monkeypatch)
    eid = engine.device.eid
    write = Transaction(op=Op.WRITE, dst_eid=eid, dst_offset=offset, data=data, src_die=die)
    wrote = await engine.bus.submit(write, None)
    read = Transaction(op=Op.READ, dst_eid=eid, dst_offset=offset, size=1024, src_die=die)
    got = await engine.bus.submit(read, None)
    assert got.data == data and _completed(local) == before  # the fabric counted nothing
    # applied once each (a clock held by a stalled host may have it checked first as well)
    assert asked.count(False) == 2 and asked[-1] is False
    fabric = local.fabric
    assert fabric is not None
    for tx, done in ((write, wrote), (read, got)):
        assert done.path == ((f"{device}.d{die}",) if die else (device,))
        timed = dataclasses.replace(tx, src_eid=eid, issue_ns=done.issue_ns)
        theirs = await fabric.transfer(timed, deadline_s=None)  # the fabric's own timing
        assert theirs.path == done.path
        assert abs((theirs.complete_ns - theirs.issue_ns) - (done.complete_ns - done.issue_ns)) <= 2
        assert done.complete_ns > done.issue_ns  # the latency, and the bytes


async def test_a_long_copy_within_a_device_is_checked_at_once_and_applied_at_its_end(
    local: InProcessSupernode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy still moving when issued (256 GiB, size-only: about 0.4 emulated seconds at a
    pool's 640 GB/s; a stall of the host is cut out of emulated time, so it is still moving
    when checked) is checked at once (a bad address fails then, nothing applied) and applied
    once its bytes have moved; the reply waits for its completion on the device's clock."""
    pool = local.devices["n00-mem"]
    size = 256 << 30
    offset, _ = await _own(local, "n00-mem", 0, size)
    asked = _counting(pool, monkeypatch)
    eid = pool.device.eid
    big = Transaction(op=Op.WRITE, dst_eid=eid, dst_offset=offset, size=size, size_only=True)
    done = await pool.bus.submit(big, None)
    assert asked == [True, False]
    assert pool.clock.now_ns() >= done.complete_ns  # answered at its completion, not before
    stray = dataclasses.replace(big, dst_offset=1 << 44)
    with pytest.raises(EmulatorError):
        await pool.bus.submit(stray, None)
    assert asked == [True, False, True]  # refused by its check: nothing applied


async def test_a_fabric_down_cuts_transfers_between_devices_not_copies_within_one(
    local: InProcessSupernode,
) -> None:
    """The fabric service killed: a transfer between devices is refused (FABRIC_DOWN), and a
    pool's copy within itself goes on, as its memory does not cross the fabric; an NPU's copy
    between its own dies crosses their die-to-die link, the fabric's, and is refused too."""
    fabric = local.fabric
    assert fabric is not None
    pool, npu = local.devices["n00-mem"], local.devices["n01-npu3"]
    offset, _ = await _own(local, "n00-mem", 0, 64)
    far, _ = await _own(local, "n01-npu3", 1, 64)
    own = Transaction(op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=offset, data=b"o" * 64)
    across = dataclasses.replace(own, dst_eid=npu.device.eid, dst_offset=far)
    sibling = dataclasses.replace(across, src_die=0)
    fabric.outage.down("kill")
    try:
        assert (await pool.bus.submit(own, None)).path == ("n00-mem",)
        with pytest.raises(UnavailableError, match="fabric service is down"):
            await local.devices["n00-npu0"].bus.submit(across, None)
        with pytest.raises(UnavailableError, match="fabric service is down"):
            await npu.bus.submit(sibling, None)
    finally:
        fabric.outage.up()
    assert len((await npu.bus.submit(sibling, None)).path) == 2  # die 0 to die 1, by the fabric
