"""A compressed day of serving by day and training by night, live (issue 24 item 5; the
scheduler's day plan, emulator/engines/dayplan.py): cm-mini in this process at a high time
scale, DeepSeek-R1 deployed with 4 decode NPUs and a 2-NPU prefill instance (2 decode NPUs at
night), clients streaming 64-token completions the whole time, and a DeepSeek-V3 job on 8 NPUs
trained at night (22-7) and resumed from its EMS checkpoint each night. Prints every switch (when,
which way, how long) and every period (tokens served, training steps); writes day_live.json
and day_live.png. The day plan's own figures are emulated; the run's wall time is not a figure.

    python bench/day_live.py [--hours 24] [--hour-s 60] [--streams 2] [--warm] [--results DIR]
    (about a minute of wall time for 24 plan hours on a quiet machine)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from cmemu.emulator.client.dayplan import day_plan, start_day_plan
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

SPEC = {"model": "deepseek-r1", "decode": {"npus": 4}, "prefill": {"instances": 1, "npus": 2}}
ENDED = ("done", "stopped", "failed")


async def _client(base: str, done: asyncio.Event, counts: collections.Counter[str]) -> None:
    """Completions one after another until the plan ends; a refusal (no footprint serving, a
    switch under way) is counted and retried a little later."""
    body = {"model": "chat", "prompt": "the day's news", "max_tokens": 64, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        while not done.is_set():
            async with session.post(f"{base}/v1/completions", json=body) as response:
                answer = await response.json()
                usage = answer.get("usage") or {}
                counts["tokens"] += int(usage.get("completion_tokens", 0))
                if response.status == 200:
                    finish = answer["choices"][0]["finish_reason"]
                    counts["completed" if finish == "length" else f"finish {finish}"] += 1
                    continue
                counts[f"status {response.status}"] += 1
            await asyncio.sleep(0.05)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    async with running_supernode("cm-mini", time_scale=args.time_scale) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(
                name="chat", spec_yaml=json.dumps(SPEC), wait=True, warm=args.warm
            )
        )
        return await _day(sn, args)


async def _day(sn: Supernode, args: argparse.Namespace) -> dict[str, Any]:
    http = sn.topology.service(ServiceKind.ROUTER).http_address
    done, counts = asyncio.Event(), collections.Counter({"tokens": 0, "completed": 0})
    wall = time.monotonic()
    await start_day_plan(
        sn.clients,
        deployment="chat",
        job=TrainingSpec(name="nightly", npus=8),
        night="22-7",
        hour_s=args.hour_s,
        start_hour=args.start_hour,
        hours=args.hours,
        night_decode_npus=2,
        drain_s=args.drain_s,
    )
    clients = [
        asyncio.create_task(_client(f"http://{http}", done, counts)) for _ in range(args.streams)
    ]
    while True:
        plan = await day_plan(sn.clients, "chat")
        if plan.state in ENDED:
            break
        await asyncio.sleep(0.5)
    done.set()
    await asyncio.gather(*clients)
    usage = await sn.clients.router().GetUsage(router_pb2.GetUsageRequest())
    counts["router_usage_tokens"] = sum(t.completion_tokens for t in usage.tenants)
    return {
        "plan": dataclasses.asdict(plan),
        "client": dict(counts),
        "wall_s": time.monotonic() - wall,
        "time_scale": args.time_scale,
    }


def report(doc: dict[str, Any]) -> None:
    plan = doc["plan"]
    print(
        f"day plan: {plan['state']} ({plan.get('error', '')}), {plan['hour_s']} emulated s per hour"
    )
    for s in plan.get("switches", []):
        print(
            f"  plan hour {s['plan_hour']:6.2f}: to {s['to']:<8}, {s['npus']} NPUs moved, took "
            f"{int(s['duration_ns']) / 1e9:7.1f} s"
        )
    for p in plan.get("periods", []):
        print(
            f"  {p['kind']:<5} from {int(p['start_ns']) / 1e9:8.1f} s: "
            f"{int(p.get('served_tokens', 0)):7d} tokens, "
            f"{int(p.get('training_steps', 0)):4d} steps"
        )
    c = doc["client"]
    others = ", ".join(
        f"{k} {v}" for k, v in c.items() if k not in ("tokens", "completed", "router_usage_tokens")
    )
    print(
        f"tokens by day {plan.get('served_tokens_day', 0)}, by night "
        f"{plan.get('served_tokens_night', 0)} (the router's usage {c['router_usage_tokens']}, "
        f"the clients' {c['tokens']}: "
        f"{c['completed']} completions whole, {others or 'none other'}); training steps "
        f"{plan.get('training_steps', 0)}"
    )


def plot(doc: dict[str, Any], directory: Path) -> None:
    periods = doc["plan"].get("periods", [])
    labels = [f"{p['kind']} {i}" for i, p in enumerate(periods)]
    with outputs.figure(directory, "day_live", ncols=2, title="cm-mini: a compressed day") as axes:
        outputs.bars(
            axes[0],
            labels,
            {"tokens served": [int(p.get("served_tokens", 0)) for p in periods]},
            title="tokens by period",
        )
        outputs.bars(
            axes[1],
            labels,
            {"training steps": [int(p.get("training_steps", 0)) for p in periods]},
            title="steps by period",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=outputs.positive, default=24.0, help="plan hours to run")
    parser.add_argument("--hour-s", type=outputs.positive, default=60.0, help="emulated s per hour")
    parser.add_argument("--start-hour", type=float, default=12.0, help="the plan's first hour")
    parser.add_argument("--time-scale", type=outputs.positive, default=100.0)
    parser.add_argument("--drain-s", type=float, default=30.0, help="emulated s of drain")
    parser.add_argument("--streams", type=int, default=2, help="clients, one request each")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="the weights already in EMS: the first deploy loads from there, not cold (its "
        "640 emulated s come before the plan and are none of its figures)",
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.streams < 1:
        parser.error(f"--streams must be >= 1, not {args.streams}")
    configure_logging("warning")
    doc = asyncio.run(_run(args))
    report(doc)
    outputs.write_json(args.results, "day_live", doc)
    plot(doc, args.results)
    outputs.announce(args.results, "day_live")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
