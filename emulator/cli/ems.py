"""`cmemu ems put|get|stat|ls|rm|exists`: the running emulator's elastic memory store, from the
shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from cmemu.v1 import ems_pb2, ems_pb2_grpc
from emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.topology import ServiceKind
from emulator.runtime import state

KINDS = {
    "kv": ems_pb2.OBJECT_KIND_KV_BLOCK,
    "weights": ems_pb2.OBJECT_KIND_WEIGHTS,
    "checkpoint": ems_pb2.OBJECT_KIND_CHECKPOINT,
}
CHUNK = DEFAULT_PROFILE.ems.chunk_bytes  # a Put's most real bytes, and a PutStream piece


async def _with_ems(args: argparse.Namespace, call: Any) -> Any:
    clients = state.clients(state.path_from(args.state_file))
    try:
        stub = ems_pb2_grpc.EmsStub(
            clients.channel_to(clients.topology.service(ServiceKind.EMS).address)
        )
        return await call(stub)
    finally:
        await clients.close()


async def _put_stream(
    ems: ems_pb2_grpc.EmsAsyncStub, head: ems_pb2.PutRequest, data: bytes
) -> ems_pb2.PutResponse:
    async def chunks() -> AsyncIterator[ems_pb2.PutChunk]:
        yield ems_pb2.PutChunk(head=head)
        for start in range(0, len(data), CHUNK):
            yield ems_pb2.PutChunk(data=data[start : start + CHUNK])

    reply: ems_pb2.PutResponse = await ems.PutStream(chunks())
    return reply


def _put(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc}") from exc
    limit = DEFAULT_PROFILE.ems.real_object_max_bytes
    request = ems_pb2.PutRequest(
        key=args.key, kind=KINDS[args.kind], pinned=args.pinned, device=args.device or ""
    )
    data = b""
    if args.size_only:
        request.size = size
    elif size > limit:
        raise InvalidArgumentError(
            f"{path} has {size} bytes; objects over {limit} bytes are stored size-only: "
            "pass --size-only"
        )
    elif size > CHUNK:
        request.size = size
        data = path.read_bytes()
    else:
        request.data = path.read_bytes()
    if data:
        reply = asyncio.run(_with_ems(args, lambda ems: _put_stream(ems, request, data)))
    else:
        reply = asyncio.run(_with_ems(args, lambda ems: ems.Put(request)))
    print(
        f"put {reply.key}: {reply.size} bytes on {', '.join(reply.replicas)} in "
        f"{(reply.complete_ns - reply.issue_ns) / 1e3:.1f} us emulated"
        + (f", {reply.evicted} evicted" if reply.evicted else "")
    )
    return 0


async def _get_stream(
    ems: ems_pb2_grpc.EmsAsyncStub, request: ems_pb2.GetRequest, size_only: bool
) -> tuple[bytes, ems_pb2.GetResponse]:
    """The object's bytes and its closing summary (with `size_only`, the bytes are dropped)."""
    parts: list[bytes] = []
    done = ems_pb2.GetResponse()
    async for chunk in ems.GetStream(request):
        if not size_only:
            parts.append(chunk.data)
        if chunk.HasField("done"):
            done = chunk.done
    return b"".join(parts), done


def _get(args: argparse.Namespace) -> int:
    request = ems_pb2.GetRequest(key=args.key, device=args.device or "")
    data, reply = asyncio.run(
        _with_ems(args, lambda ems: _get_stream(ems, request, args.size_only))
    )
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


def _stat(args: argparse.Namespace) -> int:
    reply = asyncio.run(
        _with_ems(args, lambda ems: ems.Stat(ems_pb2.StatRequest(pool=args.pool or "")))
    )
    if args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))
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


KIND_NAMES = {value: name for name, value in KINDS.items()}
TIER_NAMES = {ems_pb2.TIER_DRAM: "dram", ems_pb2.TIER_SSD: "ssd"}


def _info(o: ems_pb2.ObjectInfo) -> dict[str, Any]:
    return {
        "key": o.key,
        "size": o.size,
        "kind": KIND_NAMES.get(o.kind, "kv"),
        "pinned": o.pinned,
        "tier": TIER_NAMES.get(o.tier, "?"),
        "replicas": list(o.replicas),
    }


async def _list_all(ems: ems_pb2_grpc.EmsAsyncStub, prefix: str) -> list[ems_pb2.ObjectInfo]:
    found: list[ems_pb2.ObjectInfo] = []
    token = ""
    while True:
        page = await ems.List(ems_pb2.ListRequest(prefix=prefix, page_token=token))
        found.extend(page.objects)
        token = page.next_page_token
        if not token:
            return found


def _ls(args: argparse.Namespace) -> int:
    objects = asyncio.run(_with_ems(args, lambda ems: _list_all(ems, args.prefix or "")))
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
    request = ems_pb2.DeleteRequest(key=args.key)
    reply = asyncio.run(_with_ems(args, lambda ems: ems.Delete(request)))
    if not reply.deleted:
        raise NotFoundError(f"no object {args.key!r} to remove")
    print(f"removed {args.key}")
    return 0


def _exists(args: argparse.Namespace) -> int:
    request = ems_pb2.ExistsRequest(key=args.key)
    reply = asyncio.run(_with_ems(args, lambda ems: ems.Exists(request)))
    print("yes" if reply.exists else "no")
    return 0 if reply.exists else 1


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
