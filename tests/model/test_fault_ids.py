"""Fault ids (emulator/model/faults/ids.py): every family's ids read back as the same text, and a
malformed one is refused naming the id, each with its own error."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.ids import DEVICE_DOWN, Family, FaultId

GOOD = [
    ("dev:n00-npu3", FaultId.device("n00-npu3")),
    ("dev:n00-npu3:hang", FaultId.device("n00-npu3", "hang")),
    ("dev:sn1-n01-npu2:crash", FaultId.device("sn1-n01-npu2", "crash")),
    (
        "dev:n00-npu3:device-down",
        FaultId(family=Family.DEVICE, subject="n00-npu3", kind="device-down"),
    ),
    ("node:n03", FaultId.node("n03")),
    ("node:sn1-n03:thermal-throttle", FaultId.node("sn1-n03", "thermal-throttle")),
    ("rack:rack00", FaultId.rack("rack00")),
    ("rack:sn1-rack01", FaultId.rack("sn1-rack01")),
    ("proc:n00:process-pause", FaultId.process("n00", "process-pause")),
    ("proc:node:n00:process-kill", FaultId.process("node:n00", "process-kill")),
    ("ctr:n00-npu1:container-kill", FaultId.container("n00-npu1", "container-kill")),
    ("ckpt:job-1:40:n00-mem,n01-mem", FaultId.checkpoint("job-1", 40, ("n00-mem", "n01-mem"))),
    ("ckpt:a:b:7:n00-mem", FaultId.checkpoint("a:b", 7, ("n00-mem",))),
    ("rdma:r12", FaultId.rdma("r12")),
    ("rdma:sn0-gw-down", FaultId.rdma("sn0-gw-down")),
    ("broker", FaultId.broker()),
    ("f7", FaultId.fabric("f7")),
]


@pytest.mark.parametrize(("text", "typed"), GOOD, ids=[g[0] for g in GOOD])
def test_every_family_reads_back_as_the_same_text(text: str, typed: FaultId) -> None:
    parsed = FaultId.parse(text)
    assert parsed == typed
    assert str(parsed) == text
    assert str(typed) == text


def test_every_family_has_a_good_id_here() -> None:
    assert {FaultId.parse(text).family for text, _ in GOOD} == set(Family)


def test_a_device_id_without_a_kind_is_its_device_down() -> None:
    assert FaultId.parse("dev:n00-npu3").device_kind == DEVICE_DOWN
    assert FaultId.parse("dev:n00-npu3:sdc").device_kind == "sdc"
    assert FaultId.device("n00-npu3", DEVICE_DOWN) == FaultId.device("n00-npu3")


BAD = [
    ("", "it is empty"),
    (" f7", "no spaces"),
    ("dev:n00 npu3", "no spaces"),
    ("meteor:x", "no fault family 'meteor'"),
    ("dev:", "a dev id is dev:<device>"),
    ("dev::hang", "a dev id is dev:<device>"),
    ("dev:n00-npu3:", "a dev id is dev:<device>"),
    ("dev:n00-npu3:Hang", "'Hang' is no fault kind name"),
    ("dev:n00-npu3:hang:x", "'hang:x' is no fault kind name"),
    ("node:", "a node id is node:<node>"),
    ("rack:", "a rack id is rack:<rack>"),
    ("rack:rack00:x", "a rack id is rack:<rack>"),
    ("proc:n00", "a proc id is proc:<process>:<kind>"),
    ("proc::process-kill", "a proc id is proc:<process>:<kind>"),
    ("ctr:n00-npu1", "a ctr id is ctr:<target>:<kind>"),
    ("ctr:n00-npu1:", "a ctr id is ctr:<target>:<kind>"),
    ("ckpt:job-1:40", "a ckpt id is ckpt:<job>:<step>"),
    ("ckpt:job-1:x:n00-mem", "step is a whole number from 1, not 'x'"),
    ("ckpt:job-1:040:n00-mem", "step is a whole number from 1, not '040'"),
    ("ckpt:job-1:40:n00-mem,", "none empty"),
    ("rdma:", "a rdma id is rdma:<gateway fault id>"),
    ("broker:x", "a broker id is broker"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[b[0] or "empty" for b in BAD])
def test_a_bad_id_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        FaultId.parse(text)
    error = caught.value
    assert message in str(error)
    assert str(error).startswith(f"bad fault id '{text}'")
    assert (error.field, error.subject, error.reason) == ("id", text, "INVALID_FAULT_ID")
