"""What an EMS get or put of one chunk no longer makes, its results unchanged: no async generator
(asyncio hooks each one's first step: a WeakSet entry, a weakref callback when it is gone), and
no coroutine for the fabric's Delivers through an open gate. The twins: a device whose gate is
closed (a hang) still holds a Deliver, which still goes through when the gate opens; and a get
whose first copy is corrupt still reads the next one, the corruption counted."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cmemu.emulator.engines.device.ub import Bus
from cmemu.emulator.engines.ems import EmsState, reads
from cmemu.emulator.engines.peers import LocalDevice
from cmemu.emulator.model.errors import DeadlineExceededError
from cmemu.emulator.model.ub import Op, Transaction
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.testing import running_supernode

VALUE = bytes(range(256)) * 4


@pytest.fixture(scope="module")
async def local() -> AsyncIterator[InProcessSupernode]:
    async with running_supernode("cm-mini") as supernode:
        assert supernode.local.ems is not None and not supernode.local.ems.recovering
        yield supernode.local


def _ems(local: InProcessSupernode) -> EmsState:
    assert local.ems is not None
    return local.ems


@contextmanager
def _async_generators() -> Iterator[list[str]]:
    """The qualified names of the async generators that take a first step inside the block."""
    made: list[str] = []
    firstiter, finalizer = sys.get_asyncgen_hooks()

    def hook(agen: Any) -> None:
        made.append(agen.ag_code.co_qualname)
        if firstiter is not None:
            firstiter(agen)

    sys.set_asyncgen_hooks(firstiter=hook, finalizer=finalizer)
    try:
        yield made
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)


async def test_a_get_and_a_put_make_no_async_generator(local: InProcessSupernode) -> None:
    state = _ems(local)
    meta = state.new_object("hot-1", len(VALUE), size=0, kind=0, device="")
    await state.put(meta, VALUE)
    with _async_generators() as made:
        got = await state.get("hot-1")
        again = await state.put(state.new_object("hot-1", 4, size=0, kind=0, device=""), b"abcd")
        reading = await state.read("hot-1")
        streamed = [piece async for piece in reading.chunks()]
    assert got.data == VALUE and got.complete_ns > got.issue_ns > 0 and got.served_by
    assert again.replicas and streamed == [b"abcd"] and reading.served_by
    assert [name for name in made if not name.startswith("Reading.chunks")] == []


async def test_a_corrupt_first_copy_is_passed_by_for_the_next(local: InProcessSupernode) -> None:
    state = _ems(local)
    stored = await state.put(state.new_object("hot-2", 4, size=0, kind=0, device=""), b"good")
    first = stored.meta.replicas[stored.replicas[0]]
    pool = local.devices[stored.replicas[0]]
    pool.memory.store.write(first.offset, b"evil")  # the copy's bytes, behind EMS's back
    corrupt_before = state.counters.corrupt
    with _async_generators() as made:
        got = await state.get("hot-2")
    assert got.data == b"good" and got.corrupt_copies == 1
    assert got.served_by == stored.replicas[1] and state.counters.corrupt == corrupt_before + 1
    assert stored.replicas[0] not in stored.meta.replicas  # dropped, for the sweep to replace
    assert made == []


EMS_ENGINE = str(Path(reads.__file__).parent)  # engines/ems/


@contextmanager
def _raised() -> Iterator[list[str]]:
    """The exceptions raised in the EMS engine's frames inside the block, by type name (only
    its own: a read that waits on a busy host lets other tasks of the loop run meanwhile)."""
    raised: list[str] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception" and EMS_ENGINE in frame.f_code.co_filename:
            raised.append(arg[0].__name__)
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield raised
    finally:
        sys.settrace(previous)


async def test_a_get_ends_with_no_stop_async_iteration(local: InProcessSupernode) -> None:
    """A get takes its pieces by Copies.next, so its end raises nothing; the twin: a read's
    chunks() (GetStream's) is still an async iterator, ended by StopAsyncIteration."""
    state = _ems(local)
    await state.put(state.new_object("hot-3", len(VALUE), size=0, kind=0, device=""), VALUE)
    with _raised() as raised:
        got = await state.get("hot-3")
    assert got.data == VALUE and "StopAsyncIteration" not in raised
    reading = await state.read("hot-3")
    with _raised() as raised:
        streamed = [piece async for piece in reading.chunks()]
    assert streamed == [VALUE] and "StopAsyncIteration" in raised


def test_the_bus_delivers_with_a_plain_call() -> None:
    assert not inspect.iscoroutinefunction(Bus.deliver)
    assert inspect.iscoroutinefunction(Bus.submit)  # it awaits the fabric


async def test_a_hung_device_still_holds_a_deliver_until_it_answers(
    local: InProcessSupernode,
) -> None:
    pool = local.devices["n01-mem"]
    region = pool.allocate(4096, "hung")
    write = Transaction(
        op=Op.WRITE, dst_eid=pool.device.eid, dst_offset=region.offset, data=b"held",
        src_eid=pool.device.eid,
    )  # fmt: skip
    peer = LocalDevice(pool)
    pool.effects.answering.clear()  # what a hang fault does to its gate
    try:
        with pytest.raises(DeadlineExceededError):
            await peer.deliver(write, check_only=False, deadline_s=0.05)
        assert pool.memory.store.read(region.offset, 4) == bytes(4)  # nothing applied
        late = asyncio.ensure_future(peer.deliver(write, check_only=False, deadline_s=None))
        await asyncio.sleep(0)
        assert not late.done()
    finally:
        pool.effects.answering.set()
    assert (await late).size == 4
    assert pool.memory.store.read(region.offset, 4) == b"held"
    pool.free(region.region_id)
