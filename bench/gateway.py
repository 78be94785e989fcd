"""RDMA gateway benchmark on cm-minix2 (two supernodes in this process, the plane between them):

1. One flow: the emulated rate and time of a bulk WRITE inside a supernode (leaf, spine, leaf)
   and across supernodes (through the core), against the model (port rate x efficiency, plus
   the NICs' and switches' latency).
2. Shared flows: N concurrent bulk WRITEs out of one die share its RDMA port max-min fairly:
   each one's emulated rate against the port's share, for N = 1, 2, 4, 8.
3. Operations per second: 64-byte WRITEs through a gateway, inside a supernode (one gateway)
   and across (sn1's NPU: a Land over gRPC at sn1-gw, the timing at sn0-gw), against a raw gRPC
   health check of the same gateway, at the same client concurrency; and the CPU seconds this
   process (client and servers alike) spent per call meanwhile, which a loaded machine moves
   far less than calls per second (alternated trees compare by it: bench/hotpath.py).

Writes bench/results/gateway.json and bench/results/gateway.png.

    python bench/gateway.py [--seconds 3] [--concurrency 16] [--results DIR]
    python bench/gateway.py --seconds 0.5 --concurrency 4 --bulk-mib 16   # the quickest
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import calls_per_second, free_port_block
from cmemu.v1 import device_pb2
from cmemu.v1 import gateway_pb2 as pb

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

PRESET = "cm-minix2"
SO = DEFAULT_PROFILE.scaleout
RATE = DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die * SO.efficiency


async def _pair(clients: Clients, src: str, dst: str, remote_gateway: str) -> tuple[int, int]:
    """A connected QP from src (its gateway) to dst (remote_gateway's); its qpn and a 1 GiB
    region of dst to write into."""
    local = clients.gateway(0 if not src.startswith("sn1-") else 1)
    a = await local.CreateQp(pb.CreateQpRequest(npu=src))
    b = await clients.gateway(remote_gateway).CreateQp(pb.CreateQpRequest(npu=dst))
    await local.ConnectQp(
        pb.ConnectQpRequest(qpn=a.qpn, remote_gateway=remote_gateway, remote_qpn=b.qpn)
    )
    region = await clients.device(dst).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 30, label="bench-gateway")
    )
    return a.qpn, region.offset


async def one_flow(clients: Clients, bulk: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, dst, gateway, switches in (
        ("inside", "n01-npu0", "sn0-gw", 3),
        ("across", "sn1-n01-npu0", "sn1-gw", 5),
    ):
        qpn, offset = await _pair(clients, "n00-npu0", dst, gateway)
        done = await clients.gateway(0).Write(
            pb.RdmaRequest(qpn=qpn, remote_offset=offset, size=bulk, size_only=True)
        )
        took_s = (done.complete_ns - done.issue_ns) / 1e9
        model_s = SO.latency_s(switches) + bulk / RATE
        out[name] = {
            "bytes": bulk,
            "path": list(done.path),
            "emulated_us": took_s * 1e6,
            "model_us": model_s * 1e6,
            "gb_s": bulk / took_s / 1e9,
            "model_gb_s": bulk / model_s / 1e9,
        }
    return out


async def shared(clients: Clients, bulk: int) -> dict[str, Any]:
    """N flows out of die n00-npu1.d0, each to its own NPU of the other node."""
    out: dict[str, Any] = {}
    pairs = [await _pair(clients, "n00-npu1", f"n01-npu{1 + k}", "sn0-gw") for k in range(7)]
    pairs.append(await _pair(clients, "n00-npu1", "n01-npu0", "sn0-gw"))
    gw = clients.gateway(0)
    for n in (1, 2, 4, 8):
        done = await asyncio.gather(
            *(
                gw.Write(pb.RdmaRequest(qpn=q, remote_offset=o, size=bulk, size_only=True))
                for q, o in pairs[:n]
            )
        )
        rates = [bulk / ((d.complete_ns - d.issue_ns) / 1e9) / 1e9 for d in done]
        out[str(n)] = {
            "per_flow_gb_s": rates,
            "mean_gb_s": sum(rates) / n,
            "fair_share_gb_s": RATE / n / 1e9,
        }
    return out


async def cpu_and_rate(
    call: Callable[[], Awaitable[object]], seconds: float, concurrency: int
) -> tuple[float, float]:
    """(calls per second, CPU microseconds of this process per call) of one load loop."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rate = await calls_per_second(call, seconds, concurrency)
    calls = rate * (time.perf_counter() - wall0)
    return rate, (time.process_time() - cpu0) / max(calls, 1.0) * 1e6


async def ops_per_second(
    clients: Clients, seconds: float, concurrency: int
) -> tuple[dict[str, float], dict[str, float]]:
    """(calls per second, CPU us per call), by call."""
    gw = clients.gateway(0)
    health = health_pb2_grpc.HealthStub(clients.channel_to(clients.gateway_address(0)))
    ping = health_pb2.HealthCheckRequest(service="cmemu.v1.Gateway")
    rates, cpu = {}, {}
    rates["health_check"], cpu["health_check"] = await cpu_and_rate(
        lambda: health.Check(ping), seconds, concurrency
    )
    for name, dst, gateway in (
        ("write_64b_inside", "n01-npu5", "sn0-gw"),
        ("write_64b_across", "sn1-n01-npu5", "sn1-gw"),
    ):
        qpn, offset = await _pair(clients, "n00-npu5", dst, gateway)
        request = pb.RdmaRequest(qpn=qpn, remote_offset=offset, data=bytes(64))

        def write(r: pb.RdmaRequest = request) -> Awaitable[pb.RdmaCompletion]:
            return gw.Write(r)

        rates[name], cpu[name] = await cpu_and_rate(write, seconds, concurrency)
    return rates, cpu


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = sum(server_count(t) for t in build_cluster(PRESET))
    options = LaunchOptions(
        preset=PRESET,
        mode=InProcess(plan=PortPlan(base_port=free_port_block(ports))),
        broker=NO_BROKER,
        drain_s=0.0,
    )
    async with Supernode.start(options) as sn:
        clients = Clients(sn.supernodes[0], supernodes=sn.supernodes)
        try:
            bulk = args.bulk_mib << 20
            flows, port = await one_flow(clients, bulk), await shared(clients, bulk)
            rates, cpu = await ops_per_second(clients, args.seconds, args.concurrency)
            return {
                "preset": PRESET,
                "one_flow": flows,
                "shared_port": port,
                "ops_per_second": rates,
                "cpu_us_per_call": cpu,
                "concurrency": args.concurrency,
            }
        finally:
            await clients.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="wall seconds per ops/s run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--bulk-mib", type=int, default=256, help="size of the bulk WRITEs")
    outputs.add_option(parser)
    args = parser.parse_args(argv)
    doc = asyncio.run(run(args))
    for name, row in doc["one_flow"].items():
        print(
            f"one flow {name:6}: {row['emulated_us']:9.1f} us emulated (model "
            f"{row['model_us']:9.1f}), {row['gb_s']:6.2f} GB/s (model {row['model_gb_s']:.2f}); "
            f"{' > '.join(row['path'])}"
        )
    for n, row in doc["shared_port"].items():
        print(
            f"{n} flows on one die's port: {row['mean_gb_s']:6.2f} GB/s each "
            f"(fair share {row['fair_share_gb_s']:.2f})"
        )
    for name, value in doc["ops_per_second"].items():
        cpu_us = doc["cpu_us_per_call"][name]
        print(
            f"{name:18}: {value:8.0f} calls/s at concurrency {args.concurrency}, "
            f"{cpu_us:6.0f} us of CPU per call"
        )
    outputs.write_json(args.results, "gateway", doc)
    with outputs.figure(args.results, "gateway", ncols=3) as (flow_ax, share_ax, ops_ax):
        names = list(doc["one_flow"])
        outputs.bars(
            flow_ax,
            names,
            {
                "emulated": [doc["one_flow"][k]["gb_s"] for k in names],
                "model": [doc["one_flow"][k]["model_gb_s"] for k in names],
            },
            ylabel="GB/s",
            title=f"one {args.bulk_mib} MiB WRITE",
        )
        counts = list(doc["shared_port"])
        outputs.bars(
            share_ax,
            counts,
            {
                "emulated": [doc["shared_port"][n]["mean_gb_s"] for n in counts],
                "fair share": [doc["shared_port"][n]["fair_share_gb_s"] for n in counts],
            },
            ylabel="GB/s per flow",
            title="N flows out of one die",
        )
        ops = doc["ops_per_second"]
        outputs.bars(ops_ax, list(ops), {"calls/s": list(ops.values())}, title="ops per second")
    outputs.announce(args.results, "gateway")
    return 0


if __name__ == "__main__":
    sys.exit(main())
