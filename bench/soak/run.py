"""One soak against a running supernode: set up, load and chaos for `--seconds` while sampling
RSS, then clear every fault, let EMS settle, verify, and gather the report. Which parts run in
which order lives here only; each part is a module of its own."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.soak.churn import Churn
from bench.soak.collectives import Collectives
from bench.soak.config import warm_up_s
from bench.soak.context import Soak
from bench.soak.ems import EmsLoad
from bench.soak.ems_batch import EmsBatches
from bench.soak.faults import Chaos
from bench.soak.load import Load
from bench.soak.messages import MessageLoad
from bench.soak.report import summary
from bench.soak.sampling import Series, memdebug, rss_figures, rss_mb, sample, warm_point
from bench.soak.ub import UbLoad
from bench.soak.verify import Verify
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.runtime import state
from cmemu.v1 import ems_pb2


async def run(
    path: Path, args: argparse.Namespace, pid: int, proc_alive: Callable[[], bool]
) -> dict[str, Any]:
    """The soak of the supernode whose state file is `path` and whose server is process `pid`:
    its report (without the arguments and the targets, which the caller adds)."""
    topology = state.read(path)
    clients = Clients(topology)
    soak = Soak(topology, clients, args)
    churn = Churn(soak)  # draws its devices from the run's RNG: before the setup does
    ub = UbLoad(soak)
    messages = MessageLoad(soak)
    ems = EmsLoad(soak)
    load = Load(
        soak,
        ub=ub,
        messages=messages,
        churn=churn,
        collectives=Collectives(soak),
        ems=ems,
        batches=EmsBatches(ems),
    )
    chaos = Chaos(soak)
    verify = Verify(soak, ub, messages, ems)
    series = Series()
    report: dict[str, Any] = {}
    try:
        rss_start = rss_mb(pid)
        print("setting up: regions filled, counters zeroed, bulk regions", flush=True)
        await ub.setup()
        warm_s = warm_up_s(args.seconds)
        soak.figures.started = time.monotonic()
        soak.stop_at = soak.figures.started + args.seconds
        print(f"load for {args.seconds:.0f} s (warm-up {warm_s:.0f} s)", flush=True)

        async def stop_when_due() -> None:
            await asyncio.sleep(max(0.0, soak.stop_at - time.monotonic()))
            soak.stopping.set()

        warm_task = asyncio.ensure_future(warm_point(soak, pid, warm_s))
        tasks = [
            *(load.worker(i) for i in range(args.concurrency)),
            chaos.run(),
            sample(soak, pid, series, proc_alive),
            stop_when_due(),
        ]
        if args.memdebug is not None:
            tasks.append(memdebug(soak, pid, warm_s, args.memdebug_every))
        await asyncio.gather(*tasks)
        wall = soak.figures.now()
        rss_warm = await warm_task
        await chaos.clear_all()
        rss_end = rss_mb(pid)
        print("load stopped; faults cleared; settling EMS and verifying", flush=True)
        stat = await verify.settle_ems(120.0)
        report |= {
            "soak_seconds": round(wall, 1),
            "soak_ops": soak.figures.answered,
            "soak_ops_per_s": round(soak.figures.answered / wall, 1),
            **rss_figures(series, warm_s, wall, start=rss_start, warm=rss_warm, end=rss_end),
            "ems_settled": all(p.healthy for p in stat.pools) and not stat.under_replicated,
        }
        report |= await verify.regions()
        report |= await verify.objects()
        report |= await verify.messages_received()
        report |= await churn.sweep()
        report["not_serving_end"] = await verify.not_serving()
        report["rss_after_verify_mb"] = round(rss_mb(pid), 1)
        end = await soak.ems.Stat(ems_pb2.StatRequest())
        report["ems_end"] = {
            "objects": end.objects,
            "dram_used_bytes": end.dram_used_bytes,
            "under_replicated": end.under_replicated,
            "evictions": end.evictions,
            "corrupt_copies": end.corrupt_copies,
            "unhealthy_pools": [x.pool for x in end.pools if not x.healthy],
        }
        report["bad_keys"] = await verify.bad_key_report()
    finally:
        await clients.close()
    report |= summary(soak.figures, series, report["soak_seconds"])
    return report
