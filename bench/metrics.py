"""What a Prometheus scrape costs: one in-process supernode's /metrics, after some UB load.

For each preset: how long the event loop is held reading the state (the collector runs there;
formatting the text runs on a worker thread), the whole scrape over HTTP as a client sees it,
and the size of the answer. Medians of `--scrapes`. Writes bench/results/metrics.json and
metrics.png.

    python bench/metrics.py [--presets cm-mini cm384] [--scrapes 20] [--results DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.metrics import SupernodeCollector
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block
from cmemu.v1 import device_pb2, ub_pb2

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

LOAD_NPUS = 32  # issuers of the UB load, so that their latency histograms exist
LOAD_PER_NPU = 20


async def _load(sn: Supernode) -> None:
    npus = [d for d in sn.topology.devices if d.kind.value == "npu"][:LOAD_NPUS]
    target = npus[-1]
    region = await sn.clients.device(target.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 20)
    )
    dst = ub_pb2.UbAddress(eid=region.eid, offset=region.offset)
    for npu in npus[:-1]:
        for op in (ub_pb2.UB_OP_WRITE, ub_pb2.UB_OP_READ) * (LOAD_PER_NPU // 2):
            await sn.clients.bus(npu.id).Submit(
                ub_pb2.UbTransaction(op=op, dst=dst, size=4096, size_only=True)
            )


async def one_preset(preset: str, scrapes: int) -> dict[str, float]:
    base = free_port_block(server_count(build(preset)))
    options = LaunchOptions(
        preset=preset, mode=InProcess(plan=PortPlan(base_port=base)), broker=NO_BROKER, drain_s=0.0
    )
    async with Supernode.start(options) as sn, aiohttp.ClientSession() as session:
        await _load(sn)
        assert sn.local.metrics is not None
        collector = SupernodeCollector(sn.local)
        hold, wall, size, samples = [], [], 0, 0
        for _ in range(scrapes):
            started = time.perf_counter()
            collector.families()  # what the handler does on the loop; the rest is on a thread
            hold.append(time.perf_counter() - started)
            started = time.perf_counter()
            async with session.get(sn.local.metrics.url) as response:
                body = await response.read()
            wall.append(time.perf_counter() - started)
            size = len(body)
        samples = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
    return {
        "devices": len(sn.topology.devices),
        "loop_hold_ms": statistics.median(hold) * 1e3,
        "scrape_ms": statistics.median(wall) * 1e3,
        "bytes": size,
        "samples": samples,
    }


def plot(figures: dict[str, dict[str, float]], directory: Path) -> None:
    presets = list(figures)
    with outputs.figure(directory, "metrics", size=(6, 4)) as (ax,):
        outputs.bars(
            ax,
            [f"{p}\n{int(figures[p]['devices'])} devices" for p in presets],
            {
                "event loop held (reading the state)": [
                    figures[p]["loop_hold_ms"] for p in presets
                ],
                "whole scrape over HTTP": [figures[p]["scrape_ms"] for p in presets],
            },
            ylabel="median ms",
            title="/metrics of one in-process supernode",
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["cm-mini", "cm384"])
    parser.add_argument("--scrapes", type=int, default=20)
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.scrapes < 1:
        parser.error("--scrapes must be at least 1")
    figures = {p: asyncio.run(one_preset(p, args.scrapes)) for p in args.presets}
    for preset, r in figures.items():
        print(
            f"{preset:<8} {int(r['devices'])} devices: loop held {r['loop_hold_ms']:.1f} ms, "
            f"scrape {r['scrape_ms']:.1f} ms, {r['bytes'] / 1e3:.0f} kB, "
            f"{int(r['samples'])} samples (medians of {args.scrapes})"
        )
    outputs.write_json(args.results, "metrics", figures)
    plot(figures, args.results)
    outputs.announce(args.results, "metrics")


if __name__ == "__main__":
    main()
