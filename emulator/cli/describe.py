"""`cmemu probe`, `ls`, `topology`, `presets` and `hardware`: the commands that describe a preset
or ask a running emulator's health, with their arguments."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from cmemu.emulator.cli import argtypes
from cmemu.emulator.cli.output import Column, print_rows
from cmemu.emulator.client import health
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.client.status import code_name
from cmemu.emulator.model.errors import EmulatorError, NotFoundError
from cmemu.emulator.model.hardware import figures
from cmemu.emulator.model.presets import load_presets
from cmemu.emulator.model.topology import DeviceKind, ServiceKind, Topology, summary
from cmemu.emulator.runtime import state

PROBE_UNREACHABLE = 3
PROBE_NOT_SERVING = 4


def _topology_from_args(args: argparse.Namespace) -> tuple[Topology, ...]:
    """The documents of every supernode of the preset (one, but for `<base>x<N>`)."""
    from cmemu.emulator.cli.upmodes import plan_of
    from cmemu.emulator.runtime.supernode import InProcess, LaunchOptions

    plan = plan_of(args, loopback_default=False, strict=False)
    return LaunchOptions(
        preset=args.preset, mode=InProcess(plan=plan), time_scale=args.time_scale
    ).supernodes()


def _state_path(args: argparse.Namespace) -> Path:
    return state.path_from(args.state_file)


# --- probe, ls ---------------------------------------------------------------------------------


def cmd_probe(args: argparse.Namespace) -> int:
    try:
        ca = Path(args.cacert).read_bytes() if args.cacert else None
    except OSError as exc:
        raise argtypes.UsageError(f"--cacert: {exc}") from exc
    try:
        status = asyncio.run(
            health.check_address(
                args.address, args.service, args.timeout, credentials=Credentials(ca_pem=ca)
            )
        )
    except NotFoundError:
        print(f"{args.address}: no health status for service {args.service!r}", file=sys.stderr)
        return PROBE_NOT_SERVING
    except EmulatorError as exc:
        print(f"{args.address}: {code_name(exc)}: {exc}", file=sys.stderr)
        return PROBE_UNREACHABLE
    print(status)
    return 0 if status == "SERVING" else PROBE_NOT_SERVING


LS_COLUMNS: list[Column] = [
    ("id", "ID", "<14"),
    ("kind", "KIND", "<8"),
    ("node", "NODE", "<6"),
    ("eid", "EID", ">6"),
    ("address", "ADDRESS", "<22"),
    ("health", "HEALTH", ""),
]


def cmd_ls(args: argparse.Namespace) -> int:
    supernodes = state.read_supernodes(_state_path(args))  # every supernode's
    credentials = state.credentials(_state_path(args))
    devices = [
        d
        for t in supernodes
        for d in t.devices
        if (args.kind is None or d.kind.value == args.kind)
        and (args.node is None or d.node == args.node)
    ]
    services = [
        x
        for t in supernodes
        for x in t.services
        if args.kind in (None, x.kind.value) and not args.node
    ]
    addresses = [d.address for d in devices] + [x.address for x in services]
    # as status does: a check the host was too busy to answer in time is asked again, and one
    # still unanswered is NO_ANSWER, not a health of the device's own (issue 21 finding 16)
    statuses = asyncio.run(
        health.survey(addresses, timeout_s=args.timeout, credentials=credentials)
    )
    rows = [
        {
            "id": d.id,
            "kind": d.kind.value,
            "node": d.node,
            "eid": d.eid,
            "address": d.address,
            "health": statuses[d.address],
        }
        for d in devices
    ] + [
        {
            "id": x.id,
            "kind": x.kind.value,
            "node": "-",
            "eid": "-",
            "address": x.address,
            "health": statuses[x.address],
        }
        for x in services
    ]
    print_rows(rows, LS_COLUMNS, as_json=args.json)
    if args.json:
        return 0
    serving = sum(r["health"] == "SERVING" for r in rows)
    print(f"{serving}/{len(rows)} SERVING")
    return 0


# --- descriptive commands ----------------------------------------------------------------------


def cmd_topology(args: argparse.Namespace) -> int:
    supernodes = _topology_from_args(args)
    if args.json:  # one document, or with several supernodes a list of them
        docs = [t.to_dict() for t in supernodes]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2 if args.indent else None))
        return 0
    print("\n\n".join(summary(t) for t in supernodes))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    for p in load_presets().values():
        nodes = f"{p.supernodes} x {p.nodes}" if p.scaleout else str(p.nodes)
        print(f"{p.name:<10} {nodes:>7} nodes  {p.source:<13} {p.description}")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    for name, value, src in figures():
        print(f"{name:<42} {value!s:<40} {src}")
    return 0


def _add_state_arg(p: argparse.ArgumentParser) -> None:
    """`--name NAME | --state-file PATH`; main() resolves them into args.state_file."""
    argtypes.add_state_arg(p)


def probe_args(probe: argparse.ArgumentParser) -> None:
    probe.add_argument("address", help="HOST:PORT of the device")
    probe.add_argument(
        "--service", default="", help="service name to check (default: the whole server)"
    )
    probe.add_argument(
        "--timeout", type=argtypes.seconds, default=2.0, help="e.g. 2, 500ms (default 2 s)"
    )
    probe.add_argument(
        "--cacert",
        metavar="PEM",
        help="the CA of a supernode started with --tls (as grpcurl -cacert): probe over TLS",
    )


def ls_args(ls: argparse.ArgumentParser) -> None:
    _add_state_arg(ls)
    ls.add_argument(
        "--kind", choices=[*(k.value for k in DeviceKind), *(k.value for k in ServiceKind)]
    )
    ls.add_argument("--node", help="only this node, e.g. n07")
    ls.add_argument(
        "--timeout", type=argtypes.seconds, default=2.0, help="per health check (default 2 s)"
    )
    ls.add_argument("--json", action="store_true", help="one JSON array")


def topology_args(topo: argparse.ArgumentParser) -> None:
    from cmemu.emulator.cli import up

    up.add_topology_args(topo)
    topo.add_argument("--json", action="store_true", help="print the whole topology document")
    topo.add_argument("--indent", action="store_true", help="with --json, pretty-print")
