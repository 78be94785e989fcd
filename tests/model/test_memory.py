from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmemu.emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
)
from cmemu.emulator.model.memory import DeviceMemory, PageStore, RegionAllocator, StoreBudget

KIB = 1024


def test_allocator_first_fit_aligns_and_coalesces() -> None:
    alloc = RegionAllocator(capacity=64 * KIB, alignment=4 * KIB)
    a = alloc.allocate(1, "a")
    b = alloc.allocate(8 * KIB, "b")
    c = alloc.allocate(4 * KIB, "c")
    assert (a.offset, a.size) == (0, 4 * KIB)
    assert (b.offset, c.offset) == (4 * KIB, 12 * KIB)
    assert alloc.used == 16 * KIB
    alloc.release(b.region_id)
    alloc.release(a.region_id)
    # a and b coalesced into one 12 KiB hole before c
    assert alloc.allocate(12 * KIB).offset == 0
    assert alloc.largest_free == 48 * KIB


def test_allocator_capacity_error_names_what_is_free() -> None:
    alloc = RegionAllocator(capacity=16 * KIB, alignment=4 * KIB)
    first = alloc.allocate(4 * KIB)
    alloc.allocate(4 * KIB)
    alloc.release(first.region_id)
    with pytest.raises(CapacityError) as err:
        alloc.allocate(12 * KIB)
    assert err.value.free == 12 * KIB
    assert err.value.largest_free == 8 * KIB
    assert "12288 bytes free" in str(err.value) and "largest contiguous 8192" in str(err.value)


def test_allocator_rejects_bad_sizes_and_ids() -> None:
    alloc = RegionAllocator(capacity=16 * KIB, alignment=4 * KIB)
    with pytest.raises(InvalidArgumentError):
        alloc.allocate(0)
    with pytest.raises(NotFoundError):
        alloc.release(42)


def test_containing_requires_one_region() -> None:
    alloc = RegionAllocator(capacity=64 * KIB, alignment=4 * KIB)
    r1 = alloc.allocate(4 * KIB)
    alloc.allocate(4 * KIB)
    assert alloc.containing(100, 200) == r1
    with pytest.raises(PreconditionError):
        alloc.containing(4 * KIB - 8, 16)  # straddles two regions
    with pytest.raises(PreconditionError):
        alloc.containing(32 * KIB, 8)  # nothing allocated there


def test_page_store_round_trip_and_cap() -> None:
    store = PageStore(page_bytes=16, cap_bytes=64)
    store.write(10, b"abcdefghij")  # spans pages 0 and 1
    assert store.read(10, 10) == b"abcdefghij"
    assert store.read(0, 12) == bytes(10) + b"ab"
    assert store.stored_bytes == 32
    with pytest.raises(CapacityError):
        store.write(100, bytes(48))  # would need 3 more pages, 2 left
    assert store.read(10, 10) == b"abcdefghij"  # a refused write changes nothing
    store.discard(0, 16)
    assert store.stored_bytes == 16
    assert store.read(10, 10) == bytes(6) + b"ghij"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["write", "discard"]),
            st.integers(min_value=0, max_value=255),
            st.binary(min_size=0, max_size=64),
        ),
        max_size=30,
    )
)
def test_page_store_matches_a_flat_bytearray(ops: list[tuple[str, int, bytes]]) -> None:
    """Model check: the sparse store reads back exactly what a flat array holds."""
    store = PageStore(page_bytes=16, cap_bytes=1 << 20)
    model = bytearray(320)
    for op, offset, data in ops:
        if op == "write":
            store.write(offset, data)
            model[offset : offset + len(data)] = data
        else:
            store.discard(offset, len(data))
            model[offset : offset + len(data)] = bytes(len(data))
    assert store.read(0, 320) == bytes(model)


def _memory() -> DeviceMemory:
    return DeviceMemory(
        capacity=64 * KIB, alignment=4 * KIB, page_bytes=4 * KIB, cap_bytes=64 * KIB
    )


def test_device_memory_bounds_and_atomics() -> None:
    mem = _memory()
    region = mem.allocate(4 * KIB)
    with pytest.raises(OutOfRangeError):
        mem.read(64 * KIB, 1)
    with pytest.raises(OutOfRangeError):
        mem.write(64 * KIB - 2, b"abcd")
    with pytest.raises(InvalidArgumentError):
        mem.fetch_add(region.offset + 4, 1)
    assert mem.fetch_add(region.offset, 5) == 0
    assert mem.fetch_add(region.offset, 2**64 - 1) == 5  # wraps like hardware
    assert mem.compare_and_swap(region.offset, 4, 9) == (4, True)
    assert mem.compare_and_swap(region.offset, 4, 1) == (9, False)


def test_freed_region_forgets_its_bytes() -> None:
    mem = _memory()
    region = mem.allocate(4 * KIB)
    mem.write(region.offset, b"secret")
    mem.free(region.region_id)
    again = mem.allocate(4 * KIB)
    assert again.offset == region.offset
    assert mem.read(again.offset, 6) == bytes(6)
    assert mem.store.stored_bytes == 0


def test_size_only_write_reads_back_zeros() -> None:
    mem = _memory()
    region = mem.allocate(8 * KIB)
    mem.write(region.offset, b"x" * 100)
    mem.write_virtual(region.offset + 50, 8 * KIB - 50)
    assert mem.read(region.offset, 100) == b"x" * 50 + bytes(50)


def test_size_messages_print_the_size_asked_for_not_the_aligned_one() -> None:
    alloc = RegionAllocator(capacity=16 * KIB, alignment=4 * KIB)
    with pytest.raises(CapacityError) as err:
        alloc.allocate(16 * KIB + 1)
    assert err.value.requested == 16 * KIB + 1
    assert f"requested {16 * KIB + 1} bytes" in str(err.value)
    assert str(20 * KIB) not in str(err.value)


def test_regions_per_device_are_capped() -> None:
    alloc = RegionAllocator(capacity=64 * KIB, alignment=4 * KIB, max_regions=2)
    alloc.allocate(1)
    second = alloc.allocate(1)
    with pytest.raises(CapacityError) as err:
        alloc.allocate(1)
    assert err.value.reason == "TOO_MANY_REGIONS"
    alloc.release(second.region_id)
    alloc.allocate(1)


def test_a_budget_shared_by_stores_caps_their_sum() -> None:
    budget = StoreBudget(cap_bytes=3 * 4096)
    a = PageStore(page_bytes=4096, cap_bytes=1 << 20, budget=budget)
    b = PageStore(page_bytes=4096, cap_bytes=1 << 20, budget=budget)
    a.write(0, b"a" * 8192)
    with pytest.raises(CapacityError):
        b.write(0, b"b" * 8192)
    assert b.read(0, 4) == bytes(4) and budget.used_bytes == 8192
    b.write(0, b"b")
    a.discard(0, 8192)
    assert budget.used_bytes == 4096
    b.write(4096, b"b" * 8192)


def test_a_transfer_larger_than_the_device_is_out_of_range() -> None:
    memory = _memory()
    with pytest.raises(OutOfRangeError):
        memory.check(0, 2**64 - 1)


@given(
    st.lists(st.tuples(st.integers(0, 300), st.binary(min_size=1, max_size=40)), max_size=12),
    st.integers(0, 319),
    st.integers(0, 40),
)
def test_page_store_reads_any_range_as_a_flat_bytearray(
    writes: list[tuple[int, bytes]], offset: int, size: int
) -> None:
    """Any range, one page's part (read as a slice of the page) or across pages, unwritten or
    not, reads back what a flat array holds."""
    store = PageStore(page_bytes=16, cap_bytes=1 << 20)
    model = bytearray(400)
    for at, data in writes:
        store.write(at, data)
        model[at : at + len(data)] = data
    got = store.read(offset, size)
    assert type(got) is bytes and got == bytes(model[offset : offset + size])
