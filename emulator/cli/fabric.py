"""`cmemu xfer` and `cmemu links`: the live fabric of a running emulator, from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2
from emulator.client.clients import Clients
from emulator.model.errors import InvalidArgumentError
from emulator.runtime import state

OPS = {"read": ub_pb2.UB_OP_READ, "write": ub_pb2.UB_OP_WRITE}


async def _xfer(args: argparse.Namespace) -> dict[str, Any]:
    topology = state.read(args.state_path)
    src, dst = topology.device(args.src), topology.device(args.dst)
    clients = Clients(topology)
    try:
        region = await clients.device(dst.id).AllocateRegion(
            device_pb2.AllocateRegionRequest(size=args.bytes, label="cmemu xfer")
        )
        try:
            done = await clients.bus(src.id).Submit(
                ub_pb2.UbTransaction(
                    op=OPS[args.op],
                    dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
                    size=args.bytes,
                    size_only=True,
                    src_die=args.src_die,
                )
            )
        finally:
            await clients.device(dst.id).FreeRegion(
                device_pb2.FreeRegionRequest(region_id=region.region_id)
            )
    finally:
        await clients.close()
    seconds = (done.complete_ns - done.issue_ns) / 1e9
    return {
        "src": src.id,
        "dst": dst.id,
        "op": args.op,
        "bytes": args.bytes,
        "emulated_us": seconds * 1e6,
        "bandwidth_GB_s": args.bytes / seconds / 1e9 if seconds > 0 else 0.0,
        "path": list(done.path),
        "planes": done.planes,
        "issue_ns": done.issue_ns,
        "complete_ns": done.complete_ns,
    }


def cmd_xfer(args: argparse.Namespace) -> int:
    if args.bytes <= 0:
        raise InvalidArgumentError(f"--bytes must be > 0, got {args.bytes}")
    args.state_path = state.path_from(args.state_file)
    result = asyncio.run(_xfer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['op']} {result['bytes']} bytes {result['src']} -> {result['dst']}: "
        f"{result['emulated_us']:.3f} us emulated, {result['bandwidth_GB_s']:.2f} GB/s, "
        f"{result['planes']} planes"
    )
    print("path " + " -> ".join(result["path"]))
    return 0


def xfer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="issuing device id, e.g. n00-npu0")
    p.add_argument("dst", help="target device id, e.g. n01-mem")
    p.add_argument("--bytes", type=int, required=True, help="bytes to move (size-only payload)")
    p.add_argument("--op", choices=sorted(OPS), default="write")
    p.add_argument("--src-die", type=int, default=0, help="the issuing NPU's die (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object")


async def _links(topology_path: Any, top: int) -> fabric_pb2.LinkStats:
    clients = Clients(state.read(topology_path))
    try:
        return await clients.fabric().GetLinkStats(fabric_pb2.LinkStatsRequest(top=top))
    finally:
        await clients.close()


def cmd_links(args: argparse.Namespace) -> int:
    if args.top <= 0:
        raise InvalidArgumentError(f"--top must be > 0, got {args.top}")
    stats = asyncio.run(_links(state.path_from(args.state_file), args.top))
    rows = [
        {
            "link": s.link,
            "kind": s.kind,
            "bytes": s.bytes,
            "capacity_GB_s": s.capacity_gb_s,
            "utilization": s.utilization,
            "active_flows": s.active_flows,
            "up": s.up,
        }
        for s in stats.links
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'LINK':<34} {'KIND':<8} {'BYTES':>14} {'GB/s':>7} {'UTIL':>6} {'FLOWS':>5}  UP")
    for r in rows:
        print(
            f"{r['link']:<34} {r['kind']:<8} {r['bytes']:>14} {r['capacity_GB_s']:>7.2f} "
            f"{r['utilization']:>6.1%} {r['active_flows']:>5}  {'yes' if r['up'] else 'NO'}"
        )
    print(f"{stats.active_flows} flows in flight, {stats.completed_flows} completed")
    return 0


def links_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--top", type=int, default=20, help="how many links, busiest first (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON array")
