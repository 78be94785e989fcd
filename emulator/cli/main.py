"""The `cmemu` command line: one sub-command table, one small function per sub-command.

Exit codes: 0 success; 1 an error the emulator reported (its message on stderr); 2 a usage error.
`cmemu probe` follows grpc_health_probe: 0 SERVING, 3 unreachable or failed call, 4 not SERVING.
Human output goes to stdout, JSON logs to stderr (client commands log only warnings by default);
output piped into a reader that stops early (`| head`) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import grpc

from emulator.cli import argtypes, up
from emulator.cli.chaos import chaos_args, cmd_chaos
from emulator.cli.ems import cmd_ems, ems_args
from emulator.cli.fabric import cmd_links, cmd_xfer, links_args, xfer_args
from emulator.cli.fault import cmd_fault, fault_args
from emulator.cli.image import cmd_image, image_args
from emulator.cli.instances import cmd_down, cmd_instances, down_args, instances_args
from emulator.cli.k8s import cmd_k8s, k8s_args
from emulator.cli.manager import cmd_manager, manager_args
from emulator.cli.output import Column, print_rows
from emulator.cli.rdma import cmd_rdma, rdma_args
from emulator.cli.sched import cmd_sched, sched_args
from emulator.cli.serving import add_serving_commands
from emulator.cli.simulate import cmd_simulate, simulate_args
from emulator.cli.status import cmd_status, status_args
from emulator.cli.train import cmd_train, train_args
from emulator.cli.watch import cmd_watch, watch_args
from emulator.client import health
from emulator.client.credentials import Credentials
from emulator.client.errors import describe as describe_error
from emulator.model.errors import EmulatorError
from emulator.model.hardware import figures
from emulator.model.presets import load_presets
from emulator.model.topology import (
    DeviceKind,
    ServiceKind,
    Topology,
    summary,
)
from emulator.runtime import state
from emulator.runtime.logs import LEVELS, configure_logging
from emulator.runtime.supernode import LaunchOptions
from services.status import status_of

PROBE_UNREACHABLE = 3
PROBE_NOT_SERVING = 4
USAGE_ERROR = 2
BROKEN_PIPE = 128 + 13  # as a process killed by SIGPIPE
SERVER_COMMANDS = frozenset({"up", "serve"})  # these log at info by default, the rest at warning
DISTRIBUTION = "cloudmatrix-emulator"


def _topology_from_args(args: argparse.Namespace) -> tuple[Topology, ...]:
    """The documents of every supernode of the preset (one, but for `<base>x<N>`)."""
    return LaunchOptions(
        preset=args.preset,
        addressing=args.addressing,
        host=args.host,
        base_port=args.base_port,
        port=args.port,
        time_scale=args.time_scale,
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
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            print(f"{args.address}: no health status for service {args.service!r}", file=sys.stderr)
            return PROBE_NOT_SERVING
        print(f"{args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
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
    statuses = asyncio.run(
        health.check_many(addresses, timeout_s=args.timeout, credentials=credentials)
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


# --- parser ------------------------------------------------------------------------------------


def _add_state_arg(p: argparse.ArgumentParser) -> None:
    """`--name NAME | --state-file PATH`; main() resolves them into args.state_file."""
    argtypes.add_state_arg(p)


def _probe_args(probe: argparse.ArgumentParser) -> None:
    probe.add_argument("address", help="HOST:PORT of the device")
    probe.add_argument(
        "--service", default="", help="service name to check (default: the whole server)"
    )
    probe.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    probe.add_argument(
        "--cacert",
        metavar="PEM",
        help="the CA of a supernode started with --tls (as grpcurl -cacert): probe over TLS",
    )


def _ls_args(ls: argparse.ArgumentParser) -> None:
    _add_state_arg(ls)
    ls.add_argument(
        "--kind", choices=[*(k.value for k in DeviceKind), *(k.value for k in ServiceKind)]
    )
    ls.add_argument("--node", help="only this node, e.g. n07")
    ls.add_argument(
        "--timeout", type=float, default=2.0, help="seconds per health check (default 2)"
    )
    ls.add_argument("--json", action="store_true", help="one JSON array")


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cmemu", description="CloudMatrix supernode emulator")
    parser.add_argument("--version", action="version", version=f"cmemu {_version()}")
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        help="JSON logs on stderr at this level (default: info for up and serve, "
        "warning for every other command)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
        "up": (up.cmd_up, "run a whole supernode (in this process, as processes, or from compose)"),
        "serve": (
            up.cmd_serve,
            "serve one device, node or service of a topology (a container's entry point)",
        ),
        "compose": (up.cmd_compose, "generate a docker compose file for a preset"),
        "image": (cmd_image, "build the emulator's container image, with or without a registry"),
        "k8s": (cmd_k8s, "generate Kubernetes manifests for a preset (a directory to apply)"),
        "probe": (cmd_probe, "health-check one device (exit 0 only when SERVING)"),
        "ls": (cmd_ls, "list the running emulator's devices with their health"),
        "topology": (cmd_topology, "describe a preset's topology (--json: the full document)"),
        "presets": (cmd_presets, "list the supernode presets"),
        "hardware": (cmd_hardware, "list every hardware figure with its source"),
        "xfer": (
            cmd_xfer,
            "one UB transaction through the live fabric: emulated latency, bandwidth",
        ),
        "links": (cmd_links, "the fabric's busiest links"),
        "watch": (cmd_watch, "print the running emulator's events as they happen"),
        "ems": (cmd_ems, "the elastic memory store: put, get, ls, rm, exists, stat"),
        "sched": (cmd_sched, "the scheduler: alloc, release, ls, spares, replace, policies"),
        "rdma": (cmd_rdma, "the RDMA gateways: qp, write, read, send, stats, links, route, fault"),
        "simulate": (cmd_simulate, "model mode: serving, calibration, a long training run"),
        "manager": (cmd_manager, "the cluster manager: status, incidents, active or passive"),
        "train": (cmd_train, "training jobs: start, ls, get, stop"),
        "status": (cmd_status, "one running instance at a glance: launcher, time, health, faults"),
        "fault": (cmd_fault, "inject, list and clear device and fabric faults"),
        "chaos": (cmd_chaos, "run a chaos scenario and judge it; list fault kinds and scenarios"),
        "down": (cmd_down, "stop a running instance (SIGTERM to its launcher, then wait)"),
        "instances": (cmd_instances, "list the instances that have a state file"),
    }
    parsers = {}
    for name, (func, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        parsers[name] = p

    up.up_args(parsers["up"])
    up.serve_args(parsers["serve"])
    up.compose_args(parsers["compose"])
    k8s_args(parsers["k8s"])
    image_args(parsers["image"])
    _probe_args(parsers["probe"])
    _ls_args(parsers["ls"])
    xfer_args(parsers["xfer"])
    _add_state_arg(parsers["xfer"])
    links_args(parsers["links"])
    _add_state_arg(parsers["links"])
    ems_args(parsers["ems"], _add_state_arg)
    sched_args(parsers["sched"], _add_state_arg)
    rdma_args(parsers["rdma"], _add_state_arg)
    simulate_args(parsers["simulate"])
    manager_args(parsers["manager"], _add_state_arg)
    train_args(parsers["train"], _add_state_arg)
    watch_args(parsers["watch"])
    _add_state_arg(parsers["watch"])
    status_args(parsers["status"])
    _add_state_arg(parsers["status"])
    fault_args(parsers["fault"], _add_state_arg)
    chaos_args(parsers["chaos"], _add_state_arg)
    down_args(parsers["down"])
    _add_state_arg(parsers["down"])
    instances_args(parsers["instances"])
    add_serving_commands(sub, _add_state_arg)

    topo = parsers["topology"]
    up.add_topology_args(topo)
    topo.add_argument("--json", action="store_true", help="print the whole topology document")
    topo.add_argument("--indent", action="store_true", help="with --json, pretty-print")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level or ("info" if args.command in SERVER_COMMANDS else "warning"))
    try:
        argtypes.resolve_state(args)
        code: int = args.func(args)
        sys.stdout.flush()
    except argtypes.UsageError as exc:
        print(f"cmemu {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except EmulatorError as exc:  # raised here, not by a server: the status it would have been
        reason = f" ({exc.reason})" if exc.reason != status_of(exc).name else ""
        print(f"cmemu {args.command}: {status_of(exc).name}{reason}: {exc}", file=sys.stderr)
        return 1
    except grpc.aio.AioRpcError as exc:  # e.g. "NOT_FOUND (DEVICE_NOT_FOUND): no device ..."
        print(f"cmemu {args.command}: {describe_error(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`cmemu ls | head -1`): no traceback, nothing more to flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
