"""`cmemu ems put|get|stat|ls|rm|exists`: the running emulator's elastic memory store, from the
shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from cmemu.emulator.cli.output import wire_dict
from cmemu.emulator.client.ems import EmsClient, EmsStat, ObjectInfo, ObjectKind
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime import state

KINDS = {kind.value: kind for kind in ObjectKind}
T = TypeVar("T")


async def _with_ems(args: argparse.Namespace, call: Callable[[EmsClient], Awaitable[T]]) -> T:
    clients = state.clients(state.path_from(args.state_file))
    try:
        return await call(EmsClient(clients))
    finally:
        await clients.close()


def _put(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc}") from exc
    limit = DEFAULT_PROFILE.ems.real_object_max_bytes
    if not args.size_only and size > limit:
        raise InvalidArgumentError(
            f"{path} has {size} bytes; objects over {limit} bytes are stored size-only: "
            "pass --size-only"
        )
    data = b"" if args.size_only else path.read_bytes()
    reply = asyncio.run(
        _with_ems(
            args,
            lambda ems: ems.put(
                args.key,
                data,
                size=size if args.size_only else 0,
                kind=KINDS[args.kind],
                pinned=args.pinned,
                device=args.device or "",
            ),
        )
    )
    print(
        f"put {reply.key}: {reply.size} bytes on {', '.join(reply.replicas)} in "
        f"{(reply.complete_ns - reply.issue_ns) / 1e3:.1f} us emulated"
        + (f", {reply.evicted} evicted" if reply.evicted else "")
    )
    return 0


def _get(args: argparse.Namespace) -> int:
    reply = asyncio.run(
        _with_ems(
            args,
            lambda ems: ems.get(args.key, device=args.device or "", keep_data=not args.size_only),
        )
    )
    data = reply.data
    summary = (
        f"get {reply.key}: {reply.size} bytes from {reply.served_by} in "
        f"{(reply.complete_ns - reply.issue_ns) / 1e3:.1f} us emulated"
    )
    real = bool(data) or reply.size == 0
    if args.size_only:
        print(summary + ("" if real else " (size-only)"))
        return 0
    if not data and reply.size:
        raise PreconditionError(
            f"{args.key!r} is a size-only object ({reply.size} bytes, no bytes stored): "
            "there is nothing to write; pass --size-only for its size and timing"
        )
    if args.output:
        Path(args.output).write_bytes(data)
        print(summary)
    else:
        sys.stdout.buffer.write(data)
        print(summary, file=sys.stderr)
    return 0


def _stat_dict(s: EmsStat) -> dict[str, Any]:
    """The figures as cmemu.v1.StatResponse's JSON spells them."""
    pools = [
        wire_dict(
            [
                ("pool", p.pool),
                ("healthy", p.healthy),
                ("objects", p.objects, "int64"),
                ("bytes", p.bytes, "int64"),
                ("capacity_bytes", p.capacity_bytes, "int64"),
            ]
        )
        for p in s.pools
    ]
    return wire_dict(
        [
            ("objects", s.objects, "int64"),
            ("dram_bytes", s.dram_bytes, "int64"),
            ("dram_capacity_bytes", s.dram_capacity_bytes, "int64"),
            ("dram_used_bytes", s.dram_used_bytes, "int64"),
            ("ssd_objects", s.ssd_objects, "int64"),
            ("ssd_used_bytes", s.ssd_used_bytes, "int64"),
            ("ssd_capacity_bytes", s.ssd_capacity_bytes, "int64"),
            ("replication_factor", s.replication_factor),
            ("under_replicated", s.under_replicated, "int64"),
            ("hits", s.hits, "int64"),
            ("misses", s.misses, "int64"),
            ("evictions", s.evictions, "int64"),
            ("corrupt_copies", s.corrupt_copies, "int64"),
            ("pools", pools),
            ("recovering", s.recovering),
            ("pools_listed", s.pools_listed),
            ("pools_total", s.pools_total),
        ]
    )


def _stat(args: argparse.Namespace) -> int:
    reply = asyncio.run(_with_ems(args, lambda ems: ems.stat(args.pool or "")))
    if args.json:
        print(json.dumps(_stat_dict(reply), indent=2))
        return 0
    if reply.recovering:
        print(
            f"recovering: rebuilding the index, {reply.pools_listed} of {reply.pools_total} "
            "pools listed (calls about keys answer UNAVAILABLE RECOVERING until it ends)"
        )
    print(
        f"{reply.objects} objects, {reply.dram_bytes} bytes in DRAM (x{reply.replication_factor}), "
        f"{reply.ssd_objects} on SSD; hits {reply.hits}, misses {reply.misses}, "
        f"evictions {reply.evictions}, under-replicated {reply.under_replicated}"
    )
    for p in reply.pools:
        up = "up" if p.healthy else "DOWN"
        print(f"  {p.pool:<10} {up:<5} {p.objects:>7} objects {p.bytes:>14} bytes")
    return 0


def _info(o: ObjectInfo) -> dict[str, Any]:
    return {
        "key": o.key,
        "size": o.size,
        "kind": o.kind.value,
        "pinned": o.pinned,
        "tier": o.tier.value if o.tier is not None else "?",
        "replicas": list(o.replicas),
    }


def _ls(args: argparse.Namespace) -> int:
    objects = asyncio.run(_with_ems(args, lambda ems: ems.list(args.prefix or "")))
    rows = [_info(o) for o in objects]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        pin = "pinned" if r["pinned"] else "-"
        where = ",".join(r["replicas"]) or "-"
        print(f"{r['key']:<44} {r['size']:>14} {r['kind']:<10} {r['tier']:<4} {pin:<6} {where}")
    total = sum(r["size"] for r in rows)
    print(f"{len(rows)} object{'' if len(rows) == 1 else 's'}, {total} bytes")
    return 0


def _rm(args: argparse.Namespace) -> int:
    deleted = asyncio.run(_with_ems(args, lambda ems: ems.delete(args.key)))
    if not deleted:
        raise NotFoundError(f"no object {args.key!r} to remove")
    print(f"removed {args.key}")
    return 0


def _exists(args: argparse.Namespace) -> int:
    exists = asyncio.run(_with_ems(args, lambda ems: ems.exists(args.key)))
    print("yes" if exists else "no")
    return 0 if exists else 1


ACTIONS = {
    "put": _put,
    "get": _get,
    "stat": _stat,
    "ls": _ls,
    "rm": _rm,
    "exists": _exists,
}


def cmd_ems(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](args)


def ems_args(p: argparse.ArgumentParser, add_state: Any) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = sub.add_parser("put", help="store a file under a key")
    put.add_argument("key")
    put.add_argument("file")
    put.add_argument("--kind", choices=sorted(KINDS), default="kv")
    put.add_argument("--pinned", action="store_true", help="never evicted")
    put.add_argument(
        "--size-only", action="store_true", help="store the file's size, not its bytes"
    )
    put.add_argument("--device", help="the device the object comes from (its UB writes are timed)")
    get = sub.add_parser("get", help="fetch an object (to stdout, or -o FILE)")
    get.add_argument("key")
    get.add_argument("-o", "--output", help="write the bytes here")
    get.add_argument("--device", help="the device that reads it")
    get.add_argument(
        "--size-only",
        action="store_true",
        help="print the size and the emulated timing only, write nothing (bulk objects)",
    )
    stat = sub.add_parser("stat", help="the store's use, per pool")
    stat.add_argument("--pool", help="only this memory pool")
    stat.add_argument("--json", action="store_true")
    ls = sub.add_parser("ls", help="the stored objects, in key order")
    ls.add_argument("--prefix", help="only keys that start with this")
    ls.add_argument("--json", action="store_true")
    rm = sub.add_parser("rm", help="remove an object (exit 1 when there is none)")
    rm.add_argument("key")
    exists = sub.add_parser("exists", help="print yes or no (exit 0 when it exists, else 1)")
    exists.add_argument("key")
    for action in (put, get, stat, ls, rm, exists):
        add_state(action)
