"""`cmemu rdma qp|write|read|send|stats|links|route|fault`: the running emulator's RDMA gateways
(the scale-out plane between supernodes), from the shell. Parsing and printing only: every
decision, and every refusal, is the gateway's."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

from cmemu.emulator.cli.argtypes import (
    non_negative_int,
    positive_float,
    positive_int,
    positive_size,
    seconds,
    size,
)
from cmemu.emulator.cli.output import Column, print_rows, wire_dict
from cmemu.emulator.client.gateway import RemoteGateway, gateway_of
from cmemu.emulator.engines.gateway.types import (
    GatewayStats,
    LinkStats,
    OpRequest,
    OpResult,
    Qp,
    RdmaOp,
    RouteInfo,
)
from cmemu.emulator.model.faults import gateway as gateway_kinds
from cmemu.emulator.model.faults.params import NoParams, values
from cmemu.emulator.model.naming import parse_id
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.runtime import state

Call = Callable[[RemoteGateway], Awaitable[Any]]


async def _with_gateway(args: argparse.Namespace, which: int | str | None, call: Call) -> Any:
    clients = state.clients(state.path_from(args.state_file))
    try:
        return await call(gateway_of(clients, which))
    finally:
        await clients.close()


def _run(args: argparse.Namespace, call: Call, which: int | str | None = None) -> Any:
    return asyncio.run(_with_gateway(args, which if which is not None else args.gateway, call))


def _op_dict(done: OpResult) -> dict[str, Any]:
    """The completion as cmemu.v1.RdmaCompletion's JSON spells it."""
    return wire_dict(
        [
            ("id", done.id),
            ("op", f"RDMA_OP_{done.op.name}"),
            ("qpn", done.qpn),
            ("src", done.src),
            ("dst", done.dst),
            ("size", done.size, "int64"),
            ("data", done.data, "bytes"),
            ("issue_ns", done.issue_ns, "int64"),
            ("complete_ns", done.complete_ns, "int64"),
            ("path", done.path),
            ("paths", done.paths),
        ]
    )


def _stats_dict(got: GatewayStats) -> dict[str, Any]:
    """The counters as cmemu.v1.GatewayStats's JSON spells them."""
    return wire_dict(
        [
            ("gateway", got.gateway),
            ("down", got.down),
            ("qps", got.qps),
            ("write_ops", got.write_ops, "int64"),
            ("read_ops", got.read_ops, "int64"),
            ("send_ops", got.send_ops, "int64"),
            ("bytes_out", got.bytes_out, "int64"),
            ("bytes_in", got.bytes_in, "int64"),
            ("failed_ops", got.failed_ops, "int64"),
            ("emulated_ns", got.emulated_ns, "int64"),
        ]
    )


def _route_dict(got: RouteInfo) -> dict[str, Any]:
    """The route as cmemu.v1.RdmaRouteInfo's JSON spells it."""
    return wire_dict(
        [
            ("path", got.path),
            ("paths", got.paths),
            ("switches", got.switches),
            ("latency_ns", got.latency_ns, "int64"),
            ("max_gb_s", got.max_gb_s),
        ]
    )


QP_COLUMNS: list[Column] = [
    ("qpn", "QPN", ">4"),
    ("local", "LOCAL", "<16"),
    ("state", "STATE", "<6"),
    ("remote", "REMOTE", "<32"),
    ("ops", "OPS", ">6"),
    ("bytes", "BYTES", ""),
]
LINK_COLUMNS: list[Column] = [
    ("link", "LINK", "<34"),
    ("kind", "KIND", "<11"),
    ("capacity_gb_s", "GB/S", ">7"),
    ("bytes", "BYTES", ">14"),
    ("utilization", "UTIL", ">6"),
    ("active_flows", "FLOWS", ">5"),
    ("up", "UP", ""),
]
FAULT_COLUMNS: list[Column] = [
    ("id", "ID", "<14"),
    ("kind", "KIND", "<13"),
    ("target", "TARGET", "<28"),
    ("detail", "DETAIL", ""),
]


def _qp_row(q: Qp) -> dict[str, Any]:
    remote = f"{q.remote_gateway}/{q.remote_qpn} {q.remote_npu}.d{q.remote_die}"
    return {
        "gateway": q.gateway,
        "qpn": q.qpn,
        "local": f"{q.npu}.d{q.die}",
        "state": q.state.name,
        "remote": remote if q.remote_gateway else "-",
        "ops": q.ops,
        "bytes": q.bytes,
    }


def _qp(args: argparse.Namespace) -> int:
    action = args.qp_action
    if action == "create":
        which = args.gateway if args.gateway is not None else parse_id(args.npu).supernode
        made: Qp = _run(args, lambda g: g.create_qp(args.npu, args.die, deadline_s=None), which)
        if args.json:
            print(json.dumps(_qp_row(made), indent=2))
        else:
            print(f"created {made.gateway} qp {made.qpn} on {made.npu}.d{made.die}")
        return 0
    if action == "connect":
        qp: Qp = _run(
            args,
            lambda g: g.connect_qp(args.qpn, args.remote_gateway, args.remote_qpn, deadline_s=None),
        )
        row = _qp_row(qp)
        print(json.dumps(row, indent=2) if args.json else f"qp {qp.qpn}: RTS to {row['remote']}")
        return 0
    if action == "destroy":
        gone: int = _run(args, lambda g: g.destroy_qp(args.qpn))
        print(f"destroyed qp {gone}")
        return 0
    listed: list[Qp] = _run(args, lambda g: g.list_qps())
    rows = [_qp_row(q) for q in listed]
    if rows or args.json:
        print_rows(rows, QP_COLUMNS, as_json=args.json)
    else:
        print("no queue pairs")
    return 0


def _op(op: RdmaOp) -> Callable[[argparse.Namespace], int]:
    name = op.value.capitalize()

    def run(args: argparse.Namespace) -> int:
        data = args.data.encode() if getattr(args, "data", None) is not None else b""
        request = OpRequest(
            qpn=args.qpn,
            remote_offset=getattr(args, "offset", 0),
            data=data,
            size=args.size or 0,
            size_only=bool(args.size_only or (not data and op is not RdmaOp.READ and args.size)),
        )
        done: OpResult = _run(args, lambda g: g.op(op, request, deadline_s=None))
        took_ns = done.complete_ns - done.issue_ns
        if args.json:
            out = _op_dict(done)
            out["data"] = done.data.decode(errors="replace")
            out["duration_ns"] = took_ns
            print(json.dumps(out, indent=2))
            return 0
        rate = done.size / (took_ns / 1e9) / 1e9 if took_ns else 0.0
        print(
            f"{name.lower()} {done.size} bytes {done.src} -> {done.dst}: {took_ns / 1e3:.3f} us "
            f"emulated ({rate:.3g} GB/s), over {done.paths} path(s): {' > '.join(done.path)}"
        )
        if done.data:
            print(f"data: {done.data!r}")
        return 0

    return run


def _stats(args: argparse.Namespace) -> int:
    got: GatewayStats = _run(args, lambda g: g.stats())
    out = _stats_dict(got)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{got.gateway}{' (DOWN)' if got.down else ''}: {got.qps} queue pairs; "
        f"write {got.write_ops}, read {got.read_ops}, send {got.send_ops} ops, "
        f"{got.failed_ops} failed; {got.bytes_out} bytes moved, {got.bytes_in} landed here"
    )
    return 0


def _links(args: argparse.Namespace) -> int:
    got: LinkStats = _run(args, lambda g: g.link_stats(args.top, deadline_s=None))
    rows = [
        {
            "link": s.link,
            "kind": s.kind,
            "capacity_gb_s": round(s.capacity_gb_s, 3),
            "bytes": s.bytes,
            "utilization": round(s.utilization, 3),
            "active_flows": s.active_flows,
            "up": s.up,
        }
        for s in got.links
    ]
    print_rows(rows, LINK_COLUMNS, as_json=args.json)
    if not args.json:
        print(
            f"{got.active_flows} flows in flight, {got.completed_flows} completed "
            f"(timed by {got.authority})"
        )
    return 0


def _route(args: argparse.Namespace) -> int:
    got: RouteInfo = _run(args, lambda g: g.route(args.src, args.dst, deadline_s=None))
    if args.json:
        print(json.dumps(_route_dict(got), indent=2))
        return 0
    print(" > ".join(got.path))
    print(
        f"{got.switches} switches, {got.paths} ECMP paths, {got.latency_ns / 1e3:.3f} us, "
        f"up to {got.max_gb_s:.2f} GB/s"
    )
    return 0


def _fault_row(f: RdmaFault[Any]) -> dict[str, Any]:
    detail = [
        f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in values(f.params).items()
        if value
    ]
    if f.until_s:
        detail.append(f"until={f.until_s:.3f}s")
    return {"id": f.id, "kind": f.kind, "target": f.target, "detail": " ".join(detail)}


def _params(kind: str, factor: float | None) -> object:
    """The kind's params from the one option that sets any (--factor; 0 when left out), as
    given: the gateway checks them and names a bad or missing one."""
    cls = gateway_kinds.PARAMS.get(kind, NoParams)  # an unknown kind: the gateway names it
    given = {"factor": factor or 0.0} if "factor" in {f.name for f in fields(cls)} else {}
    made: object = cls(**given)
    return made


def _fault(args: argparse.Namespace) -> int:
    action = args.fault_action
    if action == "add":
        fault = RdmaFault(
            kind=args.kind,
            params=_params(args.kind, args.factor),
            target=args.target or "",
            for_s=args.for_s,
        )
        stored: RdmaFault[Any] = _run(args, lambda g: g.inject_fault(fault, deadline_s=None))
        print_rows([_fault_row(stored)], FAULT_COLUMNS, as_json=args.json)
        return 0
    if action == "clear":
        left: list[RdmaFault[Any]] = _run(
            args, lambda g: g.clear_fault(args.id or "", all=args.all, deadline_s=None)
        )
        print(f"cleared {args.id or 'all'}; {len(left)} left")
        return 0
    listed: list[RdmaFault[Any]] = _run(args, lambda g: g.list_faults(deadline_s=None))
    rows = [_fault_row(f) for f in listed]
    if rows or args.json:
        print_rows(rows, FAULT_COLUMNS, as_json=args.json)
    else:
        print("no faults")
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "qp": _qp,
    "write": _op(RdmaOp.WRITE),
    "read": _op(RdmaOp.READ),
    "send": _op(RdmaOp.SEND),
    "stats": _stats,
    "links": _links,
    "route": _route,
    "fault": _fault,
}


def cmd_rdma(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](args)


def _gateway_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gateway", help="the gateway to ask, by id (sn1-gw); default: sn0's (or the NPU's)"
    )


def rdma_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaves: list[argparse.ArgumentParser] = []

    qp = sub.add_parser("qp", help="queue pairs: create, connect, ls, destroy")
    qps = qp.add_subparsers(dest="qp_action", required=True, metavar="QP_ACTION")
    create = qps.add_parser("create", help="a QP on an NPU die (on that NPU's gateway)")
    create.add_argument("npu", help="an NPU (n00-npu3) or die (n00-npu3.d1)")
    create.add_argument("--die", type=non_negative_int, default=0)
    connect = qps.add_parser("connect", help="connect a QP to a remote QP (any gateway)")
    connect.add_argument("qpn", type=positive_int)
    connect.add_argument("--remote-gateway", required=True, help="e.g. sn1-gw")
    connect.add_argument("--remote-qpn", type=positive_int, required=True)
    destroy = qps.add_parser("destroy", help="destroy a QP")
    destroy.add_argument("qpn", type=positive_int)
    ls = qps.add_parser("ls", help="a gateway's QPs")
    leaves += [create, connect, destroy, ls]

    for name, what in (
        ("write", "write bytes (--data) or a size (--size) to the remote NPU's memory"),
        ("read", "read --size bytes of the remote NPU's memory"),
        ("send", "send a message (--data) or a size to the remote NPU's receive queue"),
    ):
        op = sub.add_parser(name, help=what)
        op.add_argument("qpn", type=positive_int, help="a connected QP of --gateway")
        if name != "send":
            op.add_argument("--offset", type=size, default=0, help="the remote NPU's UB offset")
        if name != "read":
            op.add_argument("--data", help="real bytes (text)")
        op.add_argument("--size", type=positive_size, help="bytes, e.g. 64MiB (bulk: size only)")
        op.add_argument("--size-only", action="store_true", help="move the size, carry no bytes")
        leaves.append(op)

    stats = sub.add_parser("stats", help="a gateway's operations and bytes")
    links = sub.add_parser("links", help="the plane's busiest links (timed by sn0's gateway)")
    links.add_argument("--top", type=positive_int, default=20)
    route = sub.add_parser("route", help="the route between two NPU dies, any supernodes")
    route.add_argument("src")
    route.add_argument("dst")
    leaves += [stats, links, route]

    fault = sub.add_parser("fault", help="plane and gateway faults: add, ls, clear")
    faults = fault.add_subparsers(dest="fault_action", required=True, metavar="FAULT_ACTION")
    add = faults.add_parser(
        "add", help="link-down|link-slow|switch-down|switch-slow|gateway-down|partition"
    )
    add.add_argument("kind")
    add.add_argument(
        "target", nargs="?", help="a link a~b, a switch, a gateway (sn1-gw), or sn0~sn1 (partition)"
    )
    add.add_argument("--factor", type=positive_float, help="the slow kinds: share kept, (0, 1)")
    add.add_argument(
        "--for",
        dest="for_s",
        type=seconds,
        default=0.0,
        metavar="DURATION",
        help="clear it after DURATION of emulated time (30s, 1h; a plain number is seconds)",
    )
    clear = faults.add_parser("clear", help="clear a fault by id, or --all")
    clear.add_argument("id", nargs="?")
    clear.add_argument("--all", action="store_true")
    fls = faults.add_parser("ls", help="the gateway's own fault and the plane's")
    leaves += [add, clear, fls]

    for leaf in leaves:
        _gateway_arg(leaf)
        leaf.add_argument("--json", action="store_true")
        add_state(leaf)
