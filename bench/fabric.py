"""Fabric benchmark, all in one run against one `cmemu up --preset cm384` process:

1. UB transactions per second through the fabric (64-byte writes: client -> issuing device ->
   fabric -> target device and back) against a raw gRPC ping (health Check) to the same process,
   both with the same client concurrency. Target ratio >= 0.4.
2. An EP320 MoE dispatch of 96 tokens per die (160 NPUs, 320 dies): its emulated time, and the
   wall time the fabric needs to compute it (median of several). Target under 50 ms.
3. Wall-clock pacing at time_scale 1 for transfers of 10 ms emulated or more: how late the reply
   reaches the client after the emulated completion instant, relative to the transfer's emulated
   duration (median and worst). Target within 5%.

    python bench/fabric.py [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2
from emulator.client.clients import Clients
from emulator.model.topology import Topology, build, server_count
from emulator.runtime import state
from emulator.testing import calls_per_second, cmemu_up, free_port_block


async def throughput(
    topology: Topology, clients: Clients, seconds: float, concurrency: int
) -> None:
    dst = topology.device("n00-npu1")
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=4096)
    )
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
        data=bytes(64),
    )
    bus = clients.bus("n00-npu0")
    health = health_pb2_grpc.HealthStub(clients.channel("n00-npu0"))
    ping = health_pb2.HealthCheckRequest()
    await calls_per_second(lambda: health.Check(ping), 0.5, concurrency)  # warm up both paths
    await calls_per_second(lambda: bus.Submit(write), 0.5, concurrency)
    pings = await calls_per_second(lambda: health.Check(ping), seconds, concurrency)
    ub = await calls_per_second(lambda: bus.Submit(write), seconds, concurrency)
    print(f"ping_per_s             {pings:,.0f}  (grpc.health.v1 Check, {concurrency} in flight)")
    print(f"ub_tx_per_s            {ub:,.0f}  (64-byte UB writes through the fabric)")
    print(f"ub_to_ping_ratio       {ub / pings:.2f}  (target >= 0.4)")


async def ep320(clients: Clients, runs: int) -> None:
    ranks = [f"n{n:02d}-npu{i}" for n in range(20) for i in range(8)]
    request = fabric_pb2.CollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH, ranks=ranks, tokens_per_rank=96, top_k=8
    )
    results = [await clients.fabric().Collective(request) for _ in range(runs)]
    r = results[-1]
    compute = statistics.median(x.wall_compute_ms for x in results)
    print(
        f"ep320_dispatch_us      {r.duration_ns / 1e3:.1f}  emulated ({r.ranks} ranks, "
        f"{r.flows:,} flows, {r.overhead_ns / 1e3:.1f} us of it software overhead)"
    )
    print(f"ep320_compute_ms       median {compute:.1f} of {runs}  (target < 50)")


async def pair_a2a_64(clients: Clients, runs: int) -> None:
    ranks = [f"n{n:02d}-npu{i}" for n in range(4) for i in range(8)]
    dies = 2 * len(ranks)
    rng = random.Random(0)
    results = []
    for _ in range(runs):
        sizes = [
            0 if i // dies == i % dies else rng.randrange(1 << 16, 1 << 24)
            for i in range(dies * dies)
        ]
        request = fabric_pb2.CollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL, ranks=ranks, pair_bytes=sizes
        )
        results.append(await clients.fabric().Collective(request))
    compute = statistics.median(x.wall_compute_ms for x in results)
    print(
        f"pair_a2a_64_compute_ms median {compute:.1f} of {runs}  ({dies} dies, "
        f"{results[-1].flows:,} flows, random pair_bytes 64 KiB-16 MiB)"
    )


async def pacing(topology: Topology, clients: Clients, clock_epoch: float) -> None:
    dst = topology.device("n01-npu0")
    size = 16 << 30
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=size)
    )
    errors = []
    for emulated_ms in (10, 20, 50, 100, 10, 20, 50, 100):
        nbytes = int(163.66e9 * emulated_ms / 1e3)
        done = await clients.bus("n00-npu0").Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
                size=nbytes,
                size_only=True,
            )
        )
        received = time.time()
        duration = (done.complete_ns - done.issue_ns) / 1e9
        due = clock_epoch + done.complete_ns / 1e9  # time_scale 1
        errors.append((received - due) / duration)
    print(
        f"pacing_late_pct        median {statistics.median(errors) * 100:.2f}, "
        f"worst {max(errors) * 100:.2f}, earliest {min(errors) * 100:.2f}  "
        "(reply after the emulated completion, % of a 10-100 ms transfer; target within 5)"
    )


async def main_async(args: argparse.Namespace, path: Path) -> None:
    topology = state.read(path)
    assert topology.epoch_wall_s is not None
    clients = Clients(topology)
    try:
        await throughput(topology, clients, args.seconds, args.concurrency)
        await ep320(clients, args.runs)
        await pair_a2a_64(clients, 3)
        await pacing(topology, clients, topology.epoch_wall_s)
    finally:
        await clients.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    base = free_port_block(server_count(build("cm384")))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        with cmemu_up(path, "--preset", "cm384", "--base-port", str(base), quiet=True):
            print("cm384 in one process (cmemu up); client in this process")
            asyncio.run(main_async(args, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
