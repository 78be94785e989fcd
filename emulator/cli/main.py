"""The `cmemu` command line: one sub-command table, one small function per sub-command.

Exit codes: 0 success; 1 an error the emulator reported (its message on stderr); 2 a usage error.
`cmemu probe` follows grpc_health_probe: 0 SERVING, 3 unreachable or failed call, 4 not SERVING.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc

from emulator.cli.ems import cmd_ems, ems_args
from emulator.cli.fabric import cmd_links, cmd_xfer, links_args, xfer_args
from emulator.cli.watch import cmd_watch, watch_args
from emulator.client import health
from emulator.model.errors import EmulatorError
from emulator.model.hardware import figures
from emulator.model.presets import DEFAULT_PRESET, load_presets
from emulator.model.topology import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    AddressPlan,
    DeviceKind,
    LoopbackPlan,
    PortPlan,
    ServiceKind,
    Topology,
    build,
)
from emulator.runtime import compose, launch, state
from emulator.runtime.logs import LEVELS, configure_logging

PROBE_UNREACHABLE = 3
PROBE_NOT_SERVING = 4


ADDRESSING: dict[str, Callable[[argparse.Namespace], AddressPlan]] = {
    "ports": lambda a: PortPlan(host=a.host, base_port=a.base_port),
    "loopback": lambda a: LoopbackPlan(port=a.port),
}


def _topology_from_args(args: argparse.Namespace) -> Topology:
    return build(args.preset, plan=ADDRESSING[args.addressing](args), time_scale=args.time_scale)


def _state_path(args: argparse.Namespace) -> Path:
    return state.path_from(args.state_file)


# --- up ----------------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    return launch.cmd_up(args, _topology_from_args)


# --- probe, ls ---------------------------------------------------------------------------------


def cmd_probe(args: argparse.Namespace) -> int:
    try:
        status = asyncio.run(health.check_address(args.address, args.service, args.timeout))
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            print(f"{args.address}: no health status for service {args.service!r}", file=sys.stderr)
            return PROBE_NOT_SERVING
        print(f"{args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return PROBE_UNREACHABLE
    print(status)
    return 0 if status == "SERVING" else PROBE_NOT_SERVING


def cmd_ls(args: argparse.Namespace) -> int:
    topology = state.read(_state_path(args))
    devices = [
        d
        for d in topology.devices
        if (args.kind is None or d.kind.value == args.kind)
        and (args.node is None or d.node == args.node)
    ]
    services = [x for x in topology.services if args.kind in (None, x.kind.value) and not args.node]
    addresses = [d.address for d in devices] + [x.address for x in services]
    statuses = asyncio.run(health.check_many(addresses, timeout_s=args.timeout))
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
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ID':<14} {'KIND':<8} {'NODE':<6} {'EID':>6}  {'ADDRESS':<22} HEALTH")
    for r in rows:
        print(
            f"{r['id']:<14} {r['kind']:<8} {r['node']:<6} {r['eid']:>6}  "
            f"{r['address']:<22} {r['health']}"
        )
    serving = sum(r["health"] == "SERVING" for r in rows)
    print(f"{serving}/{len(rows)} SERVING")
    return 0


# --- descriptive commands ----------------------------------------------------------------------


def cmd_topology(args: argparse.Namespace) -> int:
    topology = _topology_from_args(args)
    if args.json:
        print(topology.to_json(indent=2 if args.indent else None))
        return 0
    kinds = Counter(d.kind.value for d in topology.devices)
    links = Counter(link.kind.value for link in topology.links)
    tiers = Counter(s.tier for s in topology.switches)
    print(f"{topology.preset} ({topology.source}): {len(topology.nodes)} nodes")
    print("devices   " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    print("switches  " + ", ".join(f"{n} {t}" for t, n in sorted(tiers.items())))
    print("links     " + ", ".join(f"{n} {k}" for k, n in sorted(links.items())))
    print(f"addresses {topology.devices[0].address} .. {topology.devices[-1].address}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    for p in load_presets().values():
        print(f"{p.name:<10} {p.nodes:>5} nodes  {p.source:<13} {p.description}")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    for name, value, src in figures():
        print(f"{name:<42} {value!s:<40} {src}")
    return 0


# --- parser ------------------------------------------------------------------------------------


def _add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help=f"supernode preset (default {DEFAULT_PRESET}; see `cmemu presets`)",
    )
    p.add_argument(
        "--addressing",
        choices=sorted(ADDRESSING),
        default="ports",
        help="ports: one host, a port per device (default); loopback: an address "
        "127.x.y.z per device on one port, as containers have (needed past ~11,000 devices)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=CONTAINER_PORT,
        help=f"with --addressing loopback, the port of every device (default {CONTAINER_PORT})",
    )
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address every device binds (default {DEFAULT_HOST})"
    )
    p.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help=f"port of the first device; the others follow (default {DEFAULT_BASE_PORT})",
    )
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="emulated seconds per wall second (default 1)"
    )


def _add_state_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-file",
        help=f"the running emulator's state file (default ${state.ENV_VAR} or "
        f"{state.default_path()})",
    )


def _up_args(up: argparse.ArgumentParser) -> None:
    _add_topology_args(up)
    _add_state_arg(up)
    up.add_argument(
        "--mode",
        choices=sorted(launch.MODES),
        default="inprocess",
        help="inprocess: every server in this process (default); procs: one OS process per "
        "device or node, each on its own loopback address",
    )
    up.add_argument("--per", choices=compose.PER, default="device", help="with --mode procs")
    up.add_argument(
        "--from-compose",
        metavar="FILE",
        help="run the services of a compose file as local processes, each hostname becoming "
        "a loopback address",
    )
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=180.0,
        help="seconds to wait for all SERVING (default 180)",
    )
    up.add_argument(
        "--broker",
        help="MQTT broker for telemetry and events, mqtt://HOST:PORT; 'none' for no MQTT "
        "(default: an embedded broker on 127.0.0.1, its URL in the state file)",
    )
    up.add_argument(
        "--drain",
        type=float,
        default=0.2,
        help="seconds between NOT_SERVING and stop (default 0.2)",
    )


def _serve_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--topology", required=True, help="the topology document (JSON)")
    what = serve.add_mutually_exclusive_group(required=True)
    what.add_argument("--device", help="one device id")
    what.add_argument("--node", help="every device of one node, e.g. n07")
    what.add_argument("--service", help="a supernode-wide service, e.g. fabric")
    serve.add_argument(
        "--drain", type=float, default=0.5, help="seconds between NOT_SERVING and stop"
    )
    serve.add_argument(
        "--ssd-dir", help="with --service ems: where its SSD tier lives (default $CMEMU_EMS_SSD)"
    )
    serve.add_argument(
        "--rebuild-wait",
        type=float,
        default=30.0,
        help="with --service ems: seconds to wait for silent memory pools while rebuilding the "
        "index before counting them down (default 30)",
    )


def _compose_args(comp: argparse.ArgumentParser) -> None:
    comp.add_argument("--preset", default=DEFAULT_PRESET, help=f"default {DEFAULT_PRESET}")
    comp.add_argument(
        "--per",
        choices=compose.PER,
        default="device",
        help="one container per device (default) or node",
    )
    comp.add_argument(
        "-o",
        "--output",
        required=True,
        help="the compose file to write; the topology and broker config go beside it",
    )


def _probe_args(probe: argparse.ArgumentParser) -> None:
    probe.add_argument("address", help="HOST:PORT of the device")
    probe.add_argument(
        "--service", default="", help="service name to check (default: the whole server)"
    )
    probe.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cmemu", description="CloudMatrix supernode emulator")
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="JSON logs on stderr at this level (default info)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
        "up": (cmd_up, "run a whole supernode (in this process, as processes, or from compose)"),
        "serve": (
            launch.cmd_serve,
            "serve one device, node or service of a topology (a container's entry point)",
        ),
        "compose": (launch.cmd_compose, "generate a docker compose file for a preset"),
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
        "ems": (cmd_ems, "the elastic memory store: put, get, stat"),
    }
    parsers = {}
    for name, (func, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        parsers[name] = p

    _up_args(parsers["up"])
    _serve_args(parsers["serve"])
    _compose_args(parsers["compose"])
    _probe_args(parsers["probe"])
    _ls_args(parsers["ls"])
    xfer_args(parsers["xfer"])
    _add_state_arg(parsers["xfer"])
    links_args(parsers["links"])
    _add_state_arg(parsers["links"])
    ems_args(parsers["ems"], _add_state_arg)
    watch_args(parsers["watch"])
    _add_state_arg(parsers["watch"])

    topo = parsers["topology"]
    _add_topology_args(topo)
    topo.add_argument("--json", action="store_true", help="print the whole topology document")
    topo.add_argument("--indent", action="store_true", help="with --json, pretty-print")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        code: int = args.func(args)
    except EmulatorError as exc:
        print(f"cmemu {args.command}: {exc}", file=sys.stderr)
        return 1
    except grpc.aio.AioRpcError as exc:
        print(f"cmemu {args.command}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
