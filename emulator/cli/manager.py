"""`cmemu manager status|incidents|mode`: the cluster manager (cmemu.v1.ClusterManager)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from cmemu.v1 import manager_pb2, manager_pb2_grpc
from emulator.cli import argtypes
from emulator.cli.output import Column, print_rows
from emulator.runtime import state

if TYPE_CHECKING:  # the async stub type exists in the generated .pyi only
    Stub = manager_pb2_grpc.ClusterManagerAsyncStub

MODES = {"active": manager_pb2.MANAGER_MODE_ACTIVE, "passive": manager_pb2.MANAGER_MODE_PASSIVE}
NS = 1e9


def manager_args(parser: argparse.ArgumentParser, add_state: Callable[[Any], None]) -> None:
    sub = parser.add_subparsers(dest="manager_command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="mode, devices watched, suspect and failed")
    incidents = sub.add_parser("incidents", help="the incidents with their timeline")
    incidents.add_argument(
        "--since",
        type=argtypes.non_negative_seconds,
        default=0.0,
        help="emulated time (e.g. 90, 90s, 5m): only those detected after",
    )
    mode = sub.add_parser("mode", help="active (detect, isolate, replace) or passive (record)")
    mode.add_argument("mode", choices=sorted(MODES))
    for p in (status, incidents, mode):
        p.add_argument("--json", action="store_true")
        add_state(p)


async def _with(args: argparse.Namespace, call: Callable[[Stub], Awaitable[Any]]) -> Any:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        return await call(clients.manager())
    finally:
        await clients.close()


def _status(reply: manager_pb2.ManagerStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(json_format.MessageToDict(reply, preserving_proto_field_name=True)))
        return
    mode = manager_pb2.ManagerMode.Name(reply.mode).removeprefix("MANAGER_MODE_").lower()
    print(
        f"mode {mode}: {reply.devices_watched} devices watched, {reply.devices_suspect} suspect, "
        f"{reply.devices_failed} failed; {reply.open_incidents} open incidents; heartbeat every "
        f"{reply.heartbeat_interval_s:g} s (emulated), failed after {reply.misses_to_fail} misses"
    )


def _at(ns: int, since: int) -> str:
    return f"+{(ns - since) / NS:.1f}s" if ns else "-"


INCIDENT_COLUMNS: list[Column] = [
    ("id", "ID", "<10"),
    ("device", "DEVICE", "<14"),
    ("by", "BY", "<9"),
    ("state", "STATE", "<13"),
    ("detected", "DETECTED", ">9"),
    ("isolated", "ISOLATED", ">9"),
    ("replaced", "REPLACED", ">9"),
    ("restored", "RESTORED", ">9"),
    ("jobs", "JOBS", "<16"),
    ("replacements", "REPLACEMENTS", ""),
]


def _incident_row(i: manager_pb2.Incident) -> dict[str, Any]:
    """Times after the fault when the device said when it began, else after detection."""
    origin = i.fault_ns or i.detected_ns
    return {
        "id": i.id,
        "device": i.device,
        "by": i.detected_by,
        "state": i.state,
        "detected": _at(i.detected_ns, origin),
        "isolated": _at(i.isolated_ns, origin),
        "replaced": _at(i.replaced_ns, origin),
        "restored": _at(i.restored_ns, origin),
        "jobs": ",".join(i.jobs) or "-",
        "replacements": ",".join(i.replacements) or "-",
    }


def cmd_manager(args: argparse.Namespace) -> int:
    command = args.manager_command
    if command == "status":
        reply = asyncio.run(
            _with(args, lambda s: s.GetStatus(manager_pb2.GetManagerStatusRequest()))
        )
        _status(reply, args.json)
    elif command == "mode":
        request = manager_pb2.SetModeRequest(mode=MODES[args.mode])
        _status(asyncio.run(_with(args, lambda s: s.SetMode(request))), args.json)
    else:
        request_i = manager_pb2.ListIncidentsRequest(since_ns=round(args.since * NS))
        found = asyncio.run(_with(args, lambda s: s.ListIncidents(request_i))).incidents
        if args.json:
            rows = [json_format.MessageToDict(i, preserving_proto_field_name=True) for i in found]
            print(json.dumps(rows, indent=2))
        elif not found:
            print("no incidents")
        else:
            print_rows([_incident_row(i) for i in found], INCIDENT_COLUMNS, as_json=False)
    return 0
