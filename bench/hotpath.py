"""CPU per call of the hot paths (issue 18), in one process: what throughput ratios measure, read
where a loaded machine does not swamp it. bench/fabric.py and bench/ems.py time calls per second
of two processes on the wall clock, which other work on a 2-core machine moves by +-50%; this
counts the CPU seconds this process spends per call instead, alternated trees compare within a
few percent.

1. `direct`: the server side's Python alone, the servicer called without the wire (a UB Submit
   of 64 real bytes, an EMS Put and Get of 1 KiB), 32 calls in flight, on an in-process supernode.
2. `grpc`: client and server in this process, through real gRPC: a raw ping (health Check) to a
   device and to EMS, the Submit, the Put and the Get; ping CPU / op CPU is the ratio the
   throughput benchmarks' targets (0.8, 0.5, 0.8) name, when CPU is what bounds them.

    python bench/hotpath.py [--calls 6400] [--preset cm384] [--host 127.0.0.1]
    PYTHONPATH=/tmp/old python bench/hotpath.py   # another tree's code, to alternate with

Writes bench/results/hotpath.json and hotpath.png (CPU per call, and the ratios beside their
targets).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.testing import free_port_block
from cmemu.services.ems import EmsServicer
from cmemu.services.ub import UnifiedBusServicer
from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, ub_pb2

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

IN_FLIGHT = 32
KEYS = 512
VALUE = bytes(range(256)) * 4  # 1 KiB of real bytes, as bench/ems.py puts


class _NoDeadline:
    """The one thing a handler asks of its context on these paths."""

    def time_remaining(self) -> float | None:
        return None


async def cpu_us(call: Callable[[], Awaitable[object]], calls: int) -> float:
    """CPU microseconds of this process per call, `IN_FLIGHT` loops at once, after a warm-up."""

    async def loop(n: int) -> None:
        for _ in range(n):
            await call()

    await asyncio.gather(*(loop(20) for _ in range(IN_FLIGHT)))
    started = time.process_time()
    await asyncio.gather(*(loop(calls // IN_FLIGHT) for _ in range(IN_FLIGHT)))
    return (time.process_time() - started) / (calls // IN_FLIGHT * IN_FLIGHT) * 1e6


async def measure(sn: InProcessSupernode, calls: int) -> dict[str, dict[str, float]]:
    topology = sn.topology
    clients = Clients(topology)
    try:
        dst = topology.device("n00-npu1")
        region = await clients.device(dst.id).AllocateRegion(
            device_pb2.AllocateRegionRequest(size=4096)
        )
        write = ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
            data=bytes(64),
        )
        ems_address = topology.service(ServiceKind.EMS).address
        ems = ems_pb2_grpc.EmsStub(clients.channel_to(ems_address))
        puts = [ems_pb2.PutRequest(key=f"hp-{i}", data=VALUE) for i in range(KEYS)]
        gets = [ems_pb2.GetRequest(key=f"hp-{i}") for i in range(KEYS)]
        for put in puts:
            await ems.Put(put)
        count = iter(range(1 << 62))
        ctx: Any = _NoDeadline()
        bus = UnifiedBusServicer(sn.devices["n00-npu0"])
        assert sn.ems is not None, "the preset has an EMS"
        store = EmsServicer(sn.ems)
        direct = {
            "submit": await cpu_us(lambda: bus.Submit(write, ctx), calls),
            "put": await cpu_us(lambda: store.Put(puts[next(count) % KEYS], ctx), calls),
            "get": await cpu_us(lambda: store.Get(gets[next(count) % KEYS], ctx), calls),
        }
        ping = health_pb2.HealthCheckRequest()
        npu = health_pb2_grpc.HealthStub(clients.channel("n00-npu0"))
        ems_health = health_pb2_grpc.HealthStub(clients.channel_to(ems_address))
        submit = clients.bus("n00-npu0").Submit
        wire = {
            "ping": await cpu_us(lambda: npu.Check(ping), calls),
            "submit": await cpu_us(lambda: submit(write), calls),
            "ems_ping": await cpu_us(lambda: ems_health.Check(ping), calls),
            "put": await cpu_us(lambda: ems.Put(puts[next(count) % KEYS]), calls),
            "get": await cpu_us(lambda: ems.Get(gets[next(count) % KEYS]), calls),
        }
    finally:
        await clients.close()
    ratios = {
        "ub_to_ping": wire["ping"] / wire["submit"],
        "put_to_ping": wire["ems_ping"] / wire["put"],
        "get_to_ping": wire["ems_ping"] / wire["get"],
    }
    return {"direct_us": direct, "grpc_us": wire, "cpu_ratios": ratios}


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    configure_logging("warning")
    preset = build(args.preset)
    base = free_port_block(server_count(preset), host=args.host)
    topology = build(args.preset, plan=PortPlan(host=args.host, base_port=base))
    async with InProcessSupernode(topology, broker="") as sn:
        return await measure(sn, args.calls)


def plot(doc: dict[str, dict[str, float]], directory: Path) -> None:
    with outputs.figure(directory, "hotpath", ncols=2, size=(11, 4)) as (cost_ax, ratio_ax):
        names = list(doc["grpc_us"])
        outputs.bars(
            cost_ax, names, {"through gRPC": [doc["grpc_us"][n] for n in names]},
            ylabel="CPU per call (us)", title="one call, client and server in one process",
        )  # fmt: skip
        ratios = doc["cpu_ratios"]
        outputs.bars(
            ratio_ax, list(ratios), {"ping CPU / op CPU": list(ratios.values())},
            targets={"UB target": 0.8, "put target": 0.5}, title="per-ping ratios",
            value_format="%.2f",
        )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=6400)
    parser.add_argument("--preset", default="cm384")
    parser.add_argument("--host", default="127.0.0.1")
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.calls < IN_FLIGHT:
        parser.error(f"--calls must be at least {IN_FLIGHT}")
    doc = asyncio.run(main_async(args))
    for name, us in doc["direct_us"].items():
        print(f"direct_{name + '_us':<17}{us:7.1f}  (server-side Python, no wire)")
    for name, us in doc["grpc_us"].items():
        print(f"grpc_{name + '_us':<19}{us:7.1f}  (client and server in this process)")
    for name, ratio in doc["cpu_ratios"].items():
        print(f"cpu_{name:<20}{ratio:7.2f}  (ping CPU / op CPU; targets 0.8, 0.5, 0.8)")
    plot(doc, args.results)
    outputs.write_json(args.results, "hotpath", doc)
    outputs.announce(args.results, "hotpath")
    return 0


if __name__ == "__main__":
    sys.exit(main())
