"""`cmemu manager status|incidents|mode`: the cluster manager (cmemu.v1.ClusterManager)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cmemu.emulator.cli import argtypes
from cmemu.emulator.cli.output import Column, print_rows, wire_dict
from cmemu.emulator.client.manager import ManagerClient
from cmemu.emulator.engines.manager.status import ManagerStatus, Mode
from cmemu.emulator.model.manager.detector import Incident
from cmemu.emulator.runtime import state

MODES = {mode.value: mode for mode in Mode}
NS = 1e9
T = TypeVar("T")


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


async def _with(args: argparse.Namespace, call: Callable[[ManagerClient], Awaitable[T]]) -> T:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        return await call(ManagerClient(clients))
    finally:
        await clients.close()


def _status_dict(s: ManagerStatus) -> dict[str, Any]:
    """The status as cmemu.v1.ManagerStatus's JSON spells it."""
    return wire_dict(
        [
            ("mode", f"MANAGER_MODE_{s.mode.name}"),
            ("devices_watched", s.devices_watched),
            ("devices_suspect", s.devices_suspect),
            ("devices_failed", s.devices_failed),
            ("heartbeat_interval_s", s.heartbeat_interval_s),
            ("misses_to_fail", s.misses_to_fail),
            ("open_incidents", s.open_incidents),
            ("liveness_streams", s.liveness_streams),
            ("devices_covered", s.devices_covered),
        ]
    )


def _incident_dict(i: Incident) -> dict[str, Any]:
    """The incident as cmemu.v1.Incident's JSON spells it."""
    return wire_dict(
        [
            ("id", i.id),
            ("device", i.device),
            ("detected_by", i.detected_by),
            ("state", i.state),
            ("fault_ns", i.fault_ns, "int64"),
            ("detected_ns", i.detected_ns, "int64"),
            ("isolated_ns", i.isolated_ns, "int64"),
            ("replaced_ns", i.replaced_ns, "int64"),
            ("restored_ns", i.restored_ns, "int64"),
            ("jobs", i.jobs),
            ("replacements", i.replacements),
            ("detail", i.detail),
        ]
    )


def _status(reply: ManagerStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_status_dict(reply)))
        return
    mode = reply.mode.value
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


def _incident_row(i: Incident) -> dict[str, Any]:
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
        _status(asyncio.run(_with(args, lambda m: m.status())), args.json)
    elif command == "mode":
        _status(asyncio.run(_with(args, lambda m: m.set_mode(MODES[args.mode]))), args.json)
    else:
        since_ns = round(args.since * NS)
        found = asyncio.run(_with(args, lambda m: m.incidents(since_ns)))
        if args.json:
            rows = [_incident_dict(i) for i in found]
            print(json.dumps(rows, indent=2))
        elif not found:
            print("no incidents")
        else:
            print_rows([_incident_row(i) for i in found], INCIDENT_COLUMNS, as_json=False)
    return 0
