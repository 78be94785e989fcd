"""A transaction its issuer has checked (`issued`) passes the later layers' `normalize` by one
test; everything else is checked whole, and the mark never stands in for a check it skipped."""

from __future__ import annotations

import dataclasses

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.ub import Op, Transaction, checked_size, issued, normalize, slot_init


def test_issued_copies_every_field_and_marks_the_copy_checked() -> None:
    tx = Transaction(
        op=Op.WRITE, dst_eid=7, dst_offset=64, data=b"abc", compare=1, operand=2, src_die=1,
        src_device="x", arrive_ns=9,
    )  # fmt: skip
    out = issued(tx, size=checked_size(tx, 4096), src_eid=3, issue_ns=5, id="t1")
    expected = dataclasses.replace(tx, size=3, src_eid=3, issue_ns=5, id="t1")
    for f in dataclasses.fields(Transaction):  # a field added later must be copied too
        if f.name != "checked":
            assert getattr(out, f.name) == getattr(expected, f.name), f.name
    assert out.checked and not tx.checked
    assert normalize(out, 4096) is out  # passed through, no copy


def test_an_unchecked_transaction_is_checked_whole() -> None:
    with pytest.raises(InvalidArgumentError, match="only WRITE and SEND carry data"):
        normalize(Transaction(op=Op.READ, dst_eid=7, data=b"x"), 4096)
    with pytest.raises(InvalidArgumentError, match="atomics"):
        normalize(Transaction(op=Op.CAS, dst_eid=7, size=4), 4096)
    assert normalize(Transaction(op=Op.CAS, dst_eid=7), 4096).size == 8
    assert normalize(Transaction(op=Op.WRITE, dst_eid=7, data=b"ab"), 4096).size == 2


def test_a_checked_transaction_still_meets_a_lower_inline_limit() -> None:
    tx = Transaction(op=Op.WRITE, dst_eid=7, data=bytes(100))
    out = issued(tx, size=checked_size(tx, 4096), src_eid=3, issue_ns=5, id="t1")
    with pytest.raises(InvalidArgumentError, match="inline payload limit") as err:
        normalize(out, 64)
    assert err.value.reason == "PAYLOAD_TOO_LARGE"


def test_a_transaction_is_built_as_the_dataclass_would_and_stays_frozen() -> None:
    """slot_init's __init__: the dataclass's signature and defaults, every field set."""
    tx = Transaction(op=Op.READ, dst_eid=7)
    for f in dataclasses.fields(Transaction):
        if f.name not in ("op", "dst_eid"):
            assert getattr(tx, f.name) == f.default, f.name
    assert tx == Transaction(op=Op.READ, dst_eid=7, checked=True)  # `checked` not compared
    assert hash(tx) == hash(Transaction(op=Op.READ, dst_eid=7))
    with pytest.raises(dataclasses.FrozenInstanceError):
        tx.size = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        Transaction(dst_eid=7)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Transaction(Op.READ, 7)  # type: ignore[call-arg]
    assert dataclasses.replace(tx, size=8).size == 8


def test_a_transaction_is_built_through_its_slots_not_the_frozen_setattr() -> None:
    """The twin: the dataclass's own __init__ goes through object.__setattr__ per field."""
    assert "__setattr__" not in Transaction.__init__.__code__.co_names
    assert Transaction.__init__.__qualname__ == "Transaction.__init__"


def test_slot_init_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Made:
        items: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match="items"):
        slot_init(Made)
