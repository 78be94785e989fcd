"""EMS benchmark, in one run against one `cmemu up --preset cm384` process (or --preset):

1. Put and Get per second through gRPC (1 KiB objects with real bytes, checksummed), against a
   raw gRPC ping (health Check) to the same EMS server, at the same client concurrency: in
   rounds of short windows (ping, put, get; --window), each ratio the median of the rounds'.
2. The emulated latency of fetching the KV cache of a 4,096-token prefix of DeepSeek-R1
   (61 layers x 576 INT8 elements per token: 35,136 bytes a token, 144 MB in all) into a decode
   NPU, from a pool on another node versus the pool on its own node; as one object, and as 32
   blocks of 128 tokens fetched at once.
3. Put and Get of one 64 MiB object of real bytes (PutStream / GetStream, a CRC-32 per 1 MiB
   chunk, two copies): MB/s on the wall clock and the emulated microseconds.
4. The prefix hit rate of a synthetic multi-turn workload at 12.5%, 50% and 90% prefix reuse:
   each 4,096-token prompt repeats that share of an earlier conversation's tokens; the store is
   asked for the longest cached prefix (MatchPrefix), then the prompt's blocks are stored.

    python bench/ems.py [--seconds 4] [--requests 200]
    python bench/ems.py --preset cm-mini --seconds 0.5 --requests 5 --big-mib 4   # the quickest
    python bench/ems.py --seconds 6 --throughput-only   # part 1 alone, nothing written

Writes bench/results/ems.json and ems.png (calls/s and MB/s against the ping, the hit rates).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind, Topology, build, server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import calls_per_second, cmemu_up, free_port_block
from cmemu.v1 import ems_pb2, ems_pb2_grpc

try:
    from bench import outputs, progress
    from bench.rounds import print_rounds, summary, timed_rounds
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]
    from rounds import print_rounds, summary, timed_rounds  # type: ignore[import-not-found, no-redef]

KV_BYTES_PER_TOKEN = 61 * 576  # INT8 latent KV of every layer
PROMPT = 4096
BLOCK = 128


async def throughput(
    clients: Clients, ems: ems_pb2_grpc.EmsAsyncStub, address: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Calls/s of a ping, a Put and a Get in short windows taken in turn (ping, put, get, ping,
    ...), each ratio the median of its rounds' own: on a shared host a load that comes or goes
    moves the windows of one round alike, where three long runs seconds apart compared a ping
    timed in a quiet moment with an op timed in a busy one."""
    health = health_pb2_grpc.HealthStub(clients.channel_to(address))
    ping = health_pb2.HealthCheckRequest()
    counter = iter(range(10**9))
    value = bytes(range(256)) * 4

    def put() -> Awaitable[object]:
        return ems.Put(ems_pb2.PutRequest(key=f"tp-{next(counter) % 512}", data=value))

    def get() -> Awaitable[object]:
        return ems.Get(ems_pb2.GetRequest(key=f"tp-{next(counter) % 512}"))

    for i in range(512):
        await ems.Put(ems_pb2.PutRequest(key=f"tp-{i}", data=value))
    window = min(args.window, args.seconds)
    count = max(1, round(args.seconds / window))
    calls = {"ping": lambda: health.Check(ping), "put": put, "get": get}
    with progress.steps("ping, put, get per second", total=count + 1) as advance:
        await calls_per_second(calls["ping"], min(0.5, window), args.concurrency)  # warm-up
        advance(1)
        rounds = []
        for _ in range(count):
            rounds += await timed_rounds(calls, window, 1, args.concurrency)
            advance(1)
    print_rounds(rounds)
    med = summary(rounds)
    where = f"{args.concurrency} in flight, median of {count} rounds of {window:g} s windows"
    print(f"ping_per_s             {med['ping']:,.0f}  (health Check on EMS, {where})")
    print(
        f"put_per_s              {med['put']:,.0f}  ratio to ping {med['put_to_ping']:.2f}  "
        "(1 KiB, 2 copies; the ratio is the median of the rounds' ratios)"
    )
    print(
        f"get_per_s              {med['get']:,.0f}  ratio to ping {med['get_to_ping']:.2f}  "
        "(1 KiB, verified)"
    )
    return {
        "concurrency": args.concurrency,
        "ping_per_s": med["ping"],
        "put_per_s": med["put"],
        "get_per_s": med["get"],
        "put_to_ping": med["put_to_ping"],
        "get_to_ping": med["get_to_ping"],
        "window_s": window,
        "rounds": rounds,
        "object_bytes": len(value),
    }


async def kv_fetch(topology: Topology, ems: ems_pb2_grpc.EmsAsyncStub) -> dict[str, Any]:
    size = PROMPT * KV_BYTES_PER_TOKEN
    put = await ems.Put(ems_pb2.PutRequest(key="kv-4096", size=size, device="n00-npu0"))
    homes = {topology.device(p).node for p in put.replicas}
    local_node = sorted(homes)[0]
    remote_node = next((n for n in topology.nodes if n not in homes), None)
    if remote_node is None:  # a small preset: both copies' nodes are all there is
        print("kv_4096_fetch_us       skipped: every node holds a copy of the prefix")
        return {"skipped": "every node holds a copy"}
    us = {}
    for name, node in (("local", local_node), ("remote", remote_node)):
        got = await ems.Get(ems_pb2.GetRequest(key="kv-4096", device=f"{node}-npu3"))
        us[name] = (got.complete_ns - got.issue_ns) / 1e3
    ratio = us["remote"] / us["local"]
    print(
        f"kv_4096_fetch_us       local {us['local']:.0f}, remote {us['remote']:.0f}  "
        f"(one {size / 1e6:.0f} MB object into a decode NPU; remote/local {ratio:.3f})"
    )
    block_size = BLOCK * KV_BYTES_PER_TOKEN
    keys = [f"kv-4096-b{i}" for i in range(PROMPT // BLOCK)]
    for key in keys:
        await ems.Put(ems_pb2.PutRequest(key=key, size=block_size, device="n00-npu0"))
    total_us = 0.0
    for key in keys:
        got = await ems.Get(ems_pb2.GetRequest(key=key, device=f"{remote_node}-npu3"))
        total_us += (got.complete_ns - got.issue_ns) / 1e3
    print(
        f"kv_4096_blocks_us      {total_us:.0f}  (the same prefix as 32 blocks of 128 tokens, "
        "fetched one after another; each from its own pair of pools)"
    )
    return {
        "object_bytes": size,
        "local_us": us["local"],
        "remote_us": us["remote"],
        "blocks_remote_us": total_us,
        "blocks": len(keys),
    }


async def big_object(ems: ems_pb2_grpc.EmsAsyncStub, mib: int) -> dict[str, float]:
    size = mib * 2**20
    chunk = DEFAULT_PROFILE.ems.chunk_bytes
    data = random.Random(3).randbytes(size)

    async def pieces() -> AsyncIterator[ems_pb2.PutChunk]:
        yield ems_pb2.PutChunk(head=ems_pb2.PutRequest(key="big", size=size, device="n00-npu0"))
        for start in range(0, size, chunk):
            yield ems_pb2.PutChunk(data=data[start : start + chunk])

    wall = time.perf_counter()
    put = await ems.PutStream(pieces())
    put_wall = time.perf_counter() - wall
    wall = time.perf_counter()
    parts = []
    done = ems_pb2.GetResponse()
    async for piece in ems.GetStream(ems_pb2.GetRequest(key="big", device="n00-npu1")):
        parts.append(piece.data)
        if piece.HasField("done"):
            done = piece.done
    get_wall = time.perf_counter() - wall
    assert b"".join(parts) == data
    figures = {
        "object_bytes": size,
        "put_mb_per_s": size / put_wall / 1e6,
        "put_emulated_us": (put.complete_ns - put.issue_ns) / 1e3,
        "get_mb_per_s": size / get_wall / 1e6,
        "get_emulated_us": (done.complete_ns - done.issue_ns) / 1e3,
    }
    print(
        f"put_{mib}mib{'':<{14 - len(str(mib))}} {figures['put_mb_per_s']:,.0f} MB/s wall, "
        f"{figures['put_emulated_us']:.0f} us emulated  (PutStream, 2 copies)"
    )
    print(
        f"get_{mib}mib{'':<{14 - len(str(mib))}} {figures['get_mb_per_s']:,.0f} MB/s wall, "
        f"{figures['get_emulated_us']:.0f} us emulated  (GetStream, verified)"
    )
    await ems.Delete(ems_pb2.DeleteRequest(key="big"))
    return figures


async def hit_rates(ems: ems_pb2_grpc.EmsAsyncStub, requests: int) -> dict[str, float]:
    rng = random.Random(7)
    rates: dict[str, float] = {}
    for reuse in (0.125, 0.5, 0.9):
        namespace = f"bench-{reuse}"
        conversations: list[list[int]] = []
        matched = total = 0
        for _ in progress.track(range(requests), f"prefix reuse {reuse:.0%}"):
            shared = int(PROMPT * reuse)
            if conversations:
                base = rng.choice(conversations)
                prompt = base[:shared] + [rng.randrange(100_000) for _ in range(PROMPT - shared)]
            else:
                prompt = [rng.randrange(100_000) for _ in range(PROMPT)]
            request = ems_pb2.PrefixRequest(tokens=prompt, block_tokens=BLOCK, namespace=namespace)
            hit = await ems.MatchPrefix(request)
            matched += hit.matched_tokens
            total += len(prompt)
            keys = (await ems.PrefixKeys(request)).keys
            new = keys[hit.matched_blocks :]
            await ems.BatchPut(
                ems_pb2.BatchPutRequest(
                    items=[ems_pb2.PutRequest(key=k, size=BLOCK * KV_BYTES_PER_TOKEN) for k in new]
                )
            )
            conversations.append(prompt)
        rates[str(reuse)] = matched / total
        print(
            f"hit_rate_reuse_{reuse:<6} {matched / total:.3f}  "
            f"({requests} prompts of {PROMPT} tokens, {BLOCK}-token blocks)"
        )
    return rates


async def main_async(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    topology = state.read(path)
    clients = Clients(topology)
    address = topology.service(ServiceKind.EMS).address
    ems = ems_pb2_grpc.EmsStub(clients.channel_to(address))
    doc: dict[str, Any] = {"preset": args.preset}
    try:
        doc["throughput"] = await throughput(clients, ems, address, args)
        if args.throughput_only:
            return doc
        doc["kv_fetch"] = await kv_fetch(topology, ems)
        doc["big_object"] = await big_object(ems, args.big_mib)
        doc["hit_rate"] = await hit_rates(ems, args.requests)
        stat = await ems.Stat(ems_pb2.StatRequest())
        used, capacity = stat.dram_used_bytes / 1e9, stat.dram_capacity_bytes / 1e12
        print(
            f"store                  {stat.objects:,} objects, {used:.1f} GB of {capacity:.1f} TB "
            f"of DRAM used, {stat.evictions} evictions"
        )
        doc["store"] = {
            "objects": stat.objects,
            "dram_used_bytes": stat.dram_used_bytes,
            "dram_capacity_bytes": stat.dram_capacity_bytes,
            "evictions": stat.evictions,
        }
    finally:
        await clients.close()
    return doc


def plot(doc: dict[str, Any], directory: Path) -> None:
    tp, big = doc["throughput"], doc["big_object"]
    ping = tp["ping_per_s"]
    kib = tp["object_bytes"] / 1e6
    with outputs.figure(
        directory, "ems", ncols=3, title=f"EMS on {doc['preset']} (cmemu up), client in one "
        f"process, {tp['concurrency']} calls in flight"
    ) as (calls, mbs, hits):  # fmt: skip
        outputs.bars(
            calls,
            ["health ping", "Put 1 KiB", "Get 1 KiB"],
            {"calls/s": [ping, tp["put_per_s"], tp["get_per_s"]]},
            ylabel="calls per second (wall)",
            title=f"calls/s against a raw gRPC ping (median of {len(tp['rounds'])} rounds)\n"
            f"put/ping {tp['put_to_ping']:.2f}, get/ping {tp['get_to_ping']:.2f} "
            "(each the median of the rounds' ratios)",
            value_format="%.0f",
        )
        mib = big["object_bytes"] / 2**20
        outputs.bars(
            mbs,
            ["Put 1 KiB", "Get 1 KiB", f"PutStream {mib:g} MiB", f"GetStream {mib:g} MiB"],
            {
                "MB/s": [
                    tp["put_per_s"] * kib,
                    tp["get_per_s"] * kib,
                    big["put_mb_per_s"],
                    big["get_mb_per_s"],
                ]
            },
            targets={"ping rate x 1 KiB": ping * kib},
            ylabel="MB per second (wall, log)",
            title="payload bandwidth",
            log=True,
        )
        mbs.tick_params(axis="x", labelsize=7)
        reuse = [float(r) for r in doc["hit_rate"]]
        outputs.over_time(
            hits,
            [100 * r for r in reuse],
            {
                "measured (MatchPrefix)": [100 * v for v in doc["hit_rate"].values()],
                "ideal (the reuse share)": [100 * r for r in reuse],
            },
            xlabel="prefix reuse (%)",
            ylabel="prefix hit rate (%)",
            title=f"multi-turn prefix hits, {PROMPT}-token prompts",
            style="o-",
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="wall seconds of ping, of Put and of Get each"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=0.5,
        help="seconds of one window: ping, Put and Get take turns in windows this long",
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=200, help="prompts per reuse level")
    parser.add_argument("--preset", default="cm384")
    parser.add_argument("--big-mib", type=int, default=64, help="the streamed object's MiB")
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="part 1 alone (calls/s against the ping), printed; no results written",
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    counts = (args.requests, args.big_mib, args.concurrency)
    if min(args.seconds, args.window) <= 0 or min(counts) < 1:
        parser.error(
            "--seconds, --window, --requests, --big-mib and --concurrency must be positive"
        )
    assert DEFAULT_PROFILE.ems.block_tokens_min <= BLOCK
    base = free_port_block(server_count(build(args.preset)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        args_up = ("--preset", args.preset, "--base-port", str(base), "--broker", "none")
        with cmemu_up(path, *args_up, quiet=True):
            print(f"{args.preset} in one process (cmemu up); client in this process")
            doc = asyncio.run(main_async(path, args))
    if args.throughput_only:
        return 0
    outputs.write_json(args.results, "ems", doc)
    plot(doc, args.results)
    outputs.announce(args.results, "ems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
