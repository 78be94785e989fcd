"""EMS benchmark, in one run against one `cmemu up --preset cm384` process:

1. Put and Get per second through gRPC (1 KiB objects with real bytes, checksummed), against a
   raw gRPC ping (health Check) to the same EMS server, at the same client concurrency.
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

from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.v1 import ems_pb2, ems_pb2_grpc
from emulator.client.clients import Clients
from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.topology import ServiceKind, Topology, build, server_count
from emulator.runtime import state
from emulator.testing import calls_per_second, cmemu_up, free_port_block

try:
    from bench import progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import progress  # type: ignore[import-not-found, no-redef]

KV_BYTES_PER_TOKEN = 61 * 576  # INT8 latent KV of every layer
PROMPT = 4096
BLOCK = 128


async def throughput(
    clients: Clients, ems: ems_pb2_grpc.EmsAsyncStub, address: str, args: argparse.Namespace
) -> None:
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
    await calls_per_second(lambda: health.Check(ping), 0.5, args.concurrency)
    pings = await calls_per_second(lambda: health.Check(ping), args.seconds, args.concurrency)
    puts = await calls_per_second(put, args.seconds, args.concurrency)
    gets = await calls_per_second(get, args.seconds, args.concurrency)
    print(
        f"ping_per_s             {pings:,.0f}  (health Check on EMS, {args.concurrency} in flight)"
    )
    print(
        f"put_per_s              {puts:,.0f}  ratio to ping {puts / pings:.2f}  (1 KiB, 2 copies)"
    )
    print(
        f"get_per_s              {gets:,.0f}  ratio to ping {gets / pings:.2f}  (1 KiB, verified)"
    )


async def kv_fetch(topology: Topology, ems: ems_pb2_grpc.EmsAsyncStub) -> None:
    size = PROMPT * KV_BYTES_PER_TOKEN
    put = await ems.Put(ems_pb2.PutRequest(key="kv-4096", size=size, device="n00-npu0"))
    homes = {topology.device(p).node for p in put.replicas}
    local_node = sorted(homes)[0]
    remote_node = next(n for n in topology.nodes if n not in homes)
    results = {}
    for name, node in (("local", local_node), ("remote", remote_node)):
        got = await ems.Get(ems_pb2.GetRequest(key="kv-4096", device=f"{node}-npu3"))
        results[name] = (got.complete_ns - got.issue_ns) / 1e3
    ratio = results["remote"] / results["local"]
    print(
        f"kv_4096_fetch_us       local {results['local']:.0f}, remote {results['remote']:.0f}  "
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


async def big_object(ems: ems_pb2_grpc.EmsAsyncStub) -> None:
    size = 64 * 2**20
    chunk = DEFAULT_PROFILE.ems.chunk_bytes
    data = random.Random(3).randbytes(size)

    async def pieces() -> AsyncIterator[ems_pb2.PutChunk]:
        yield ems_pb2.PutChunk(head=ems_pb2.PutRequest(key="big-64", size=size, device="n00-npu0"))
        for start in range(0, size, chunk):
            yield ems_pb2.PutChunk(data=data[start : start + chunk])

    wall = time.perf_counter()
    put = await ems.PutStream(pieces())
    put_wall = time.perf_counter() - wall
    wall = time.perf_counter()
    parts = []
    done = ems_pb2.GetResponse()
    async for piece in ems.GetStream(ems_pb2.GetRequest(key="big-64", device="n00-npu1")):
        parts.append(piece.data)
        if piece.HasField("done"):
            done = piece.done
    get_wall = time.perf_counter() - wall
    assert b"".join(parts) == data
    print(
        f"put_64mib              {size / put_wall / 1e6:,.0f} MB/s wall, "
        f"{(put.complete_ns - put.issue_ns) / 1e3:.0f} us emulated  (PutStream, 2 copies)"
    )
    print(
        f"get_64mib              {size / get_wall / 1e6:,.0f} MB/s wall, "
        f"{(done.complete_ns - done.issue_ns) / 1e3:.0f} us emulated  (GetStream, verified)"
    )
    await ems.Delete(ems_pb2.DeleteRequest(key="big-64"))


async def hit_rates(ems: ems_pb2_grpc.EmsAsyncStub, requests: int) -> None:
    rng = random.Random(7)
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
        print(
            f"hit_rate_reuse_{reuse:<6} {matched / total:.3f}  "
            f"({requests} prompts of {PROMPT} tokens, {BLOCK}-token blocks)"
        )


async def main_async(path: Path, args: argparse.Namespace) -> None:
    topology = state.read(path)
    clients = Clients(topology)
    address = topology.service(ServiceKind.EMS).address
    ems = ems_pb2_grpc.EmsStub(clients.channel_to(address))
    try:
        await throughput(clients, ems, address, args)
        await kv_fetch(topology, ems)
        await big_object(ems)
        await hit_rates(ems, args.requests)
        stat = await ems.Stat(ems_pb2.StatRequest())
        used, capacity = stat.dram_used_bytes / 1e9, stat.dram_capacity_bytes / 1e12
        print(
            f"store                  {stat.objects:,} objects, {used:.1f} GB of {capacity:.1f} TB "
            f"of DRAM used, {stat.evictions} evictions"
        )
    finally:
        await clients.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    assert DEFAULT_PROFILE.ems.block_tokens_min <= BLOCK
    base = free_port_block(server_count(build("cm384")))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        args_up = ("--preset", "cm384", "--base-port", str(base), "--broker", "none")
        with cmemu_up(path, *args_up, quiet=True):
            print("cm384 in one process (cmemu up); client in this process")
            asyncio.run(main_async(path, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
