"""The gateway's messages <-> its domain types (emulator/client/wire/gateway.py): what goes
over the wire comes back equal, and an op the gateway does not know is refused by field."""

from __future__ import annotations

import pytest

from cmemu.emulator.client.wire import gateway as wire
from cmemu.emulator.engines.gateway.types import Landing, OpResult, Qp, QpState, RdmaOp
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.v1 import gateway_pb2


def test_round_trips() -> None:
    qp = Qp(gateway="sn1-gw", qpn=3, npu="n10-npu1", die=1, created_ns=5, state=QpState.ERROR)
    assert wire.qp(wire.qp_proto(qp)) == qp
    land = Landing(
        op=RdmaOp.SEND, npu="n00-npu2", offset=8, data=b"x", size=1, size_only=False,
        check_only=True, src="n10-npu1.d1", id="a", issue_ns=7, complete_ns=9,
    )  # fmt: skip
    assert wire.landing(wire.landing_proto(land)) == land
    done = OpResult(
        id="a", op=RdmaOp.READ, qpn=3, src="x.d0", dst="y.d1", size=4, data=b"abcd",
        issue_ns=1, complete_ns=2, path=("x.d0", "leaf", "y.d1"), paths=2,
    )  # fmt: skip
    assert wire.op_result(wire.op_result_proto(done)) == done


def test_a_fault_keeps_its_instants_to_the_nanosecond() -> None:
    fault = RdmaFault(
        kind="link-slow",
        params=LinkDegradedParams(factor=0.25),
        target="a~b",
        for_s=0.05,
        since_s=123456789 / 1e9,
        id="r1",
    )
    sent = wire.fault_proto(fault)
    back = wire.fault_proto(wire.fault(sent))
    assert back == sent and sent.until_ns == sent.since_ns + 50_000_000


def test_an_unknown_op_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="op must be WRITE, READ or SEND") as err:
        wire.landing(gateway_pb2.LandRequest(npu="n00-npu0"))
    assert err.value.field == "op"
