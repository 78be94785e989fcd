"""`cmemu sched alloc|release|ls|spares|replace|policies|day`: the running emulator's scheduler,
from the shell. Parsing and printing only: every decision (and every refusal) is the service's."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cmemu.emulator.cli import schedday
from cmemu.emulator.cli.argtypes import non_negative_int, positive_int
from cmemu.emulator.cli.output import Column, print_rows
from cmemu.emulator.client.scheduler import Allocation, SchedulerClient
from cmemu.emulator.runtime import state

T = TypeVar("T")
Call = Callable[[SchedulerClient], Awaitable[T]]


async def _with_scheduler(args: argparse.Namespace, call: Call[T]) -> T:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        return await call(SchedulerClient(clients))
    finally:
        await clients.close()


def _run(args: argparse.Namespace, call: Call[T]) -> T:
    return asyncio.run(_with_scheduler(args, call))


NPU_COLUMNS: list[Column] = [
    ("id", "NPU", "<12"),
    ("node", "NODE", "<6"),
    ("rack", "RACK", ">4"),
    ("dies", "DIES", "<28"),
    ("state", "STATE", ""),
]
JOB_COLUMNS: list[Column] = [
    ("job", "JOB", "<20"),
    ("npus", "NPUS", ">5"),
    ("nodes", "NODES", ">5"),
    ("racks", "RACKS", "<12"),
    ("policy", "POLICY", "<15"),
    ("priority", "PRIO", ">5"),
    ("failed", "FAILED", ""),
]
POLICY_COLUMNS: list[Column] = [("name", "POLICY", "<16"), ("description", "DESCRIPTION", "")]


def _npu_rows(a: Allocation) -> list[dict[str, Any]]:
    return [
        {
            "id": n.id,
            "node": n.node,
            "rack": n.rack,
            "dies": ",".join(n.dies),
            "state": "failed" if n.failed else "ok",
        }
        for n in a.npus
    ]


def _job_row(a: Allocation) -> dict[str, Any]:
    return {
        "job": a.job,
        "npus": len(a.npus),
        "nodes": len(a.nodes),
        "racks": ",".join(str(r) for r in a.racks),
        "policy": a.policy,
        "priority": a.priority,
        "failed": ",".join(n.id for n in a.npus if n.failed) or "-",
        "npu_ids": [n.id for n in a.npus],
        "allocated_ns": a.allocated_ns,
    }


def _summary(a: Allocation) -> str:
    racks = ",".join(str(r) for r in a.racks)
    return (
        f"{a.job}: {len(a.npus)} NPUs on {len(a.nodes)} node{'s' * (len(a.nodes) != 1)} "
        f"({', '.join(a.nodes)}), rack{'s' * (len(a.racks) != 1)} {racks}, by {a.policy}"
    )


def _alloc(args: argparse.Namespace) -> int:
    reply = _run(
        args,
        lambda s: s.allocate(
            args.job,
            args.npus,
            whole_nodes=args.whole_nodes,
            same_rack=args.same_rack,
            priority=args.priority,
            policy=args.policy or "",
        ),
    )
    if args.json:
        print(json.dumps({**_job_row(reply), "detail": _npu_rows(reply)}, indent=2))
        return 0
    print(f"allocated {_summary(reply)}")
    print_rows(_npu_rows(reply), NPU_COLUMNS, as_json=False)
    return 0


def _release(args: argparse.Namespace) -> int:
    reply = _run(args, lambda s: s.release(args.job))
    print(f"released {reply.job}: {reply.npus} NPUs")
    return 0


def _ls(args: argparse.Namespace) -> int:
    reply = _run(args, lambda s: s.allocations())
    rows = [_job_row(a) for a in reply.allocations]
    if args.json:
        counts = {
            "total_npus": reply.total_npus,
            "free_npus": reply.free_npus,
            "allocated_npus": reply.allocated_npus,
            "spare_npus": reply.spare_npus,
            "failed_npus": reply.failed_npus,
        }
        print(json.dumps({"allocations": rows, **counts}, indent=2))
        return 0
    if rows:
        print_rows(rows, JOB_COLUMNS, as_json=False)
    else:
        print("no allocations")
    print(
        f"{reply.total_npus} NPUs: {reply.allocated_npus} allocated, {reply.free_npus} free, "
        f"{reply.spare_npus} spare, {reply.failed_npus} failed"
    )
    return 0


def _spares(args: argparse.Namespace) -> int:
    reply = _run(args, lambda s: s.spares(args.set))
    if args.json:
        print(json.dumps({"target": reply.target, "npus": list(reply.npus)}, indent=2))
        return 0
    print(f"{len(reply.npus)} spare NPUs (target {reply.target}): {' '.join(reply.npus) or '-'}")
    return 0


def _replace(args: argparse.Namespace) -> int:
    replaced, allocation = _run(
        args, lambda s: s.replace(args.job, npu=args.npu or "", node=args.node or "")
    )
    if args.json:
        swaps = [{"old": r.old, "new": r.new} for r in replaced]
        print(json.dumps({"replaced": swaps, **_job_row(allocation)}, indent=2))
        return 0
    for r in replaced:
        print(f"replaced {r.old} -> {r.new}")
    print(_summary(allocation))
    return 0


def _policies(args: argparse.Namespace) -> int:
    policies = _run(args, lambda s: s.policies())
    rows = [
        {
            "name": p.name,
            "description": p.description + (" (default)" if p.default else ""),
            "default": p.default,
        }
        for p in policies
    ]
    print_rows(rows, POLICY_COLUMNS, as_json=args.json)
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "alloc": _alloc,
    "release": _release,
    "ls": _ls,
    "spares": _spares,
    "replace": _replace,
    "policies": _policies,
}


def cmd_sched(args: argparse.Namespace) -> int:
    if args.action == "day":
        return schedday.cmd_day(args)
    return ACTIONS[args.action](args)


def sched_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    alloc = sub.add_parser("alloc", help="allocate NPUs to a job (refused when they do not fit)")
    alloc.add_argument("job")
    alloc.add_argument("--npus", type=positive_int, required=True, help="whole NPUs")
    alloc.add_argument(
        "--whole-nodes", action="store_true", help="only entirely free nodes (a multiple of 8)"
    )
    alloc.add_argument("--same-rack", action="store_true", help="every NPU in one rack")
    alloc.add_argument("--priority", type=int, default=0, help="recorded with the allocation")
    alloc.add_argument("--policy", help="see `cmemu sched policies` (default: topology-aware)")
    alloc.add_argument("--json", action="store_true")
    release = sub.add_parser("release", help="give a job's NPUs back")
    release.add_argument("job")
    ls = sub.add_parser("ls", help="the allocations, and the NPUs free, spare and failed")
    ls.add_argument("--json", action="store_true")
    spares = sub.add_parser("spares", help="the spare NPUs; --set N reserves N")
    spares.add_argument("--set", type=non_negative_int, metavar="N")
    spares.add_argument("--json", action="store_true")
    replace = sub.add_parser("replace", help="swap a job's NPU, or its NPUs in a node, for spares")
    replace.add_argument("job")
    target = replace.add_mutually_exclusive_group(required=True)
    target.add_argument("--npu", help="one NPU of the job, e.g. n03-npu5")
    target.add_argument("--node", help="every NPU the job holds in this node, e.g. n03")
    replace.add_argument("--json", action="store_true")
    policies = sub.add_parser("policies", help="the allocation policies")
    policies.add_argument("--json", action="store_true")
    for action in (alloc, release, ls, spares, replace, policies):
        add_state(action)
    schedday.day_args(sub, add_state)
