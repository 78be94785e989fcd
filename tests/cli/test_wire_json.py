"""`--json` of the commands that moved to the typed clients prints what it printed when it was
the protobuf's MessageToDict: the domain values, spelled by cli/output.py `wire_dict`, give
the same JSON text, default fields, 64-bit integers, bytes and key order included."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from cmemu.emulator.cli import ems, manager, rdma, schedday, train
from cmemu.emulator.client import dayplan, training
from cmemu.emulator.client import ems as ems_client
from cmemu.emulator.client import manager as manager_client
from cmemu.emulator.client.wire import gateway as gateway_wire
from cmemu.v1 import ems_pb2, gateway_pb2, manager_pb2, scheduler_pb2, training_pb2

CASES: list[tuple[Message, Callable[[Any], dict[str, Any]]]] = [
    (
        gateway_pb2.RdmaCompletion(
            id="x1", op=gateway_pb2.RDMA_OP_READ, qpn=3, src="a", dst="b", size=10,
            data=b"hi\xff", issue_ns=5, complete_ns=99, path=["a", "b"], paths=2,
        ),
        lambda m: rdma._op_dict(gateway_wire.op_result(m)),
    ),
    (
        gateway_pb2.RdmaCompletion(op=gateway_pb2.RDMA_OP_WRITE, size=10, complete_ns=99),
        lambda m: rdma._op_dict(gateway_wire.op_result(m)),
    ),
    (
        gateway_pb2.GatewayStats(gateway="g", down=True, qps=2, write_ops=2, send_ops=1,
                                 bytes_out=5, failed_ops=1, emulated_ns=123),
        lambda m: rdma._stats_dict(gateway_wire.stats(m)),
    ),
    (
        gateway_pb2.RdmaRouteInfo(path=["a", "b"], paths=4, switches=3, latency_ns=1500,
                                  max_gb_s=24.123456789),
        lambda m: rdma._route_dict(gateway_wire.route(m)),
    ),
    (
        ems_pb2.StatResponse(
            objects=3, dram_bytes=10, replication_factor=2, recovering=True, pools_listed=1,
            pools_total=2, pools=[ems_pb2.PoolStat(pool="p0", healthy=True, objects=2, bytes=5,
                                                   capacity_bytes=100), ems_pb2.PoolStat()],
        ),
        lambda m: ems._stat_dict(ems_client._stat(m)),
    ),
    (ems_pb2.StatResponse(), lambda m: ems._stat_dict(ems_client._stat(m))),
    (
        manager_pb2.ManagerStatus(mode=manager_pb2.MANAGER_MODE_PASSIVE, devices_watched=3,
                                  heartbeat_interval_s=0.5, misses_to_fail=3),
        lambda m: manager._status_dict(manager_client._status(m)),
    ),
    (
        manager_pb2.Incident(id="i1", device="d", detected_by="heartbeat", state="isolated",
                             detected_ns=5, jobs=["j"], detail="x"),
        lambda m: manager._incident_dict(manager_client._incident(m)),
    ),
    (
        training_pb2.TrainingJob(name="j", state="running", step=5, npus=["a", "b"], restarts=1,
                                 step_s=0.25, started_ns=3, goodput=0.9),
        lambda m: train._job_dict(training._job(m)),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("message", "spelled"), CASES)
def test_the_json_is_the_messages(
    message: Message, spelled: Callable[[Any], dict[str, Any]]
) -> None:
    expected = MessageToDict(message, preserving_proto_field_name=True)
    assert json.dumps(spelled(message), indent=2) == json.dumps(expected, indent=2)


@pytest.mark.parametrize(
    "plan",
    [
        scheduler_pb2.DayPlan(
            name="p", deployment="chat", night="22-7", hour_s=60.0, state="day", plan_hour=2.5,
            switches=[scheduler_pb2.DaySwitch(at_ns=5, plan_hour=22.0, to="training", npus=2)],
            periods=[scheduler_pb2.DayPeriod(kind="day", served_tokens=7)],
            served_tokens_day=7, started_ns=9,
        ),
        scheduler_pb2.DayPlan(),
    ],
)  # fmt: skip
def test_a_day_plan_shows_every_field_as_before(plan: scheduler_pb2.DayPlan) -> None:
    expected = MessageToDict(
        plan, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    got = schedday._doc(dayplan._plan(plan))
    assert json.dumps(got, indent=2) == json.dumps(expected, indent=2)
