"""The router's OpenAI endpoint on this machine: sustained concurrent streams and the overhead per
token. The cm-mini supernode (and its router) runs in this process through the typed launch API;
each round's client is a process of its own.

1. Saturation: at time_scale 100 emulated time never holds a token back, so the endpoint sends
   as fast as the router can drive the engine (two fabric collectives per step, one SSE chunk
   per token): N concurrent streams of 64 tokens each; wall tokens per second and wall
   microseconds per token, by N.
2. Real time: at time_scale 1, each chunk should leave when the emulated clock reaches its
   token; how late it reaches the client (wall milliseconds after the instant its emulated
   timestamp maps to), median and 99th percentile, by N.

Both deploy decode 8 NPUs + prefill 1x4 (768 decode slots). Streams are read with aiohttp (a
lighter client than `openai`, so that the figures are the endpoint's).

    python bench/serving_live.py [--streams 1,16,64,256] [--repeat 3] [--results DIR]
    python bench/serving_live.py --streams 1 --repeat 1   # the quickest

Writes bench/results/serving_live.json and bench/results/serving_live.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block
from cmemu.v1 import router_pb2

try:
    from bench import outputs, progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]

TOKENS = 64
# Weights load in a second, not minutes: the benchmark measures serving, not loading.
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=1.0, cache_from_ems_s=0.5),
)


async def _stream(
    session: aiohttp.ClientSession, url: str, i: int, clock: Clock, late_ms: list[float]
) -> int:
    body = {
        "model": "bench",
        "prompt": [(31 * i + j) % 50_000 + 1 for j in range(256)],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    tokens = 0
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            extra = chunk["cmemu"]
            if chunk["choices"][0]["finish_reason"] is None:
                tokens += extra["count"]
                late_ms.append((time.time() - clock.wall_at(extra["emulated_ns"])) * 1e3)
    return tokens


async def _round(url: str, n: int, clock: Clock) -> dict[str, Any]:
    late: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        tokens = sum(
            await asyncio.gather(*(_stream(session, url, i, clock, late) for i in range(n)))
        )
        wall = time.perf_counter() - started
    late.sort()
    return {
        "streams": n,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "us_per_token": wall / tokens * 1e6,
        "late_ms_p50": statistics.median(late),
        "late_ms_p99": late[int(0.99 * (len(late) - 1))],
    }


async def _client(url: str, n: int, epoch: float, scale: float) -> None:
    """The client side, in a process of its own: one round, its figures as JSON on stdout."""
    clock = Clock(time_scale=scale, epoch_wall_s=epoch)
    print(json.dumps(await _round(url, n, clock)))


async def _serve(time_scale: float, counts: list[int], repeat: int) -> list[dict[str, Any]]:
    """The supernode in this process (weights load in a second: see PROFILE), each round's
    client a separate process."""
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(server_count(build("cm-mini"))))),
        time_scale=time_scale,
        profile=PROFILE,
        broker="none",
        drain_s=0.0,
    )
    async with Supernode.start(options) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(
                name="bench", model="deepseek-r1", decode_npus=8, prefill_instances=1,
                prefill_npus=4, wait=True,
            )
        )  # fmt: skip
        topology = sn.local.topology if sn.local is not None else sn.topology
        url = f"http://{topology.service(ServiceKind.ROUTER).http_address}/v1/completions"
        rounds = sum(repeat if n != 2 else 1 for n in [2, *counts])
        rows = []
        with progress.steps(f"rounds at time_scale {time_scale:g}", rounds) as advance:
            for n in [2, *counts]:  # the first round (once) warms up connections and collectives
                rows.append(
                    await _median_round(
                        url,
                        n,
                        1 if n == 2 else repeat,
                        epoch=topology.epoch_wall_s,
                        time_scale=time_scale,
                        advance=advance,
                    )
                )
        return rows[1:]


async def _median_round(
    url: str,
    n: int,
    repeat: int,
    *,
    epoch: float | None,
    time_scale: float,
    advance: Callable[[int], None],
) -> dict[str, Any]:
    """The median of `repeat` rounds of n streams (the machine is shared), each round's client a
    process of its own."""
    runs = []
    for _ in range(repeat):
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", url, "--streams", str(n),
            "--epoch", repr(epoch), "--scale", repr(time_scale),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await child.communicate()
        assert child.returncode == 0
        runs.append(json.loads(out))
        advance(1)
    runs.sort(key=lambda r: r["tokens_per_s"])
    return runs[len(runs) // 2]  # type: ignore[no-any-return]


def plot(figures: dict[str, Any], directory: Path) -> None:
    sat, real = figures["saturation"]["rows"], figures["realtime"]["rows"]
    with outputs.figure(directory, "serving_live", ncols=2, size=(10, 4), dpi=100) as (left, right):
        outputs.over_time(
            left,
            [r["streams"] for r in sat],
            {"tokens/s": [r["tokens_per_s"] for r in sat]},
            xlabel="concurrent streams",
            ylabel="tokens/s (wall)",
            title="saturation (time_scale 100)",
            style="o-",
            logx=True,
        )
        outputs.over_time(
            right,
            [r["streams"] for r in real],
            {key[8:]: [r[key] for r in real] for key in ("late_ms_p50", "late_ms_p99")},
            xlabel="concurrent streams",
            ylabel="chunk lateness (wall ms)",
            title="real time (time_scale 1)",
            style="o-",
            logx=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per count (the median)")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--epoch", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, help=argparse.SUPPRESS)
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.client:
        asyncio.run(_client(args.client, int(args.streams), args.epoch, args.scale))
        return 0
    configure_logging("warning")
    try:
        counts = [int(x) for x in args.streams.split(",")]
    except ValueError:
        parser.error(f"--streams: comma-separated counts, not {args.streams!r}")
    if args.repeat < 1 or min(counts) < 1:
        parser.error("--repeat and every --streams count must be at least 1")
    figures: dict[str, Any] = {}
    for label, scale in (("saturation", 100.0), ("realtime", 1.0)):
        rows = asyncio.run(_serve(scale, counts, args.repeat))
        figures[label] = {"time_scale": scale, "rows": rows}
        print(f"{label} (time_scale {scale:g}), {TOKENS} tokens a stream:")
        for r in rows:
            print(
                f"  {r['streams']:>4} streams: {r['tokens_per_s']:>8.0f} tokens/s wall, "
                f"{r['us_per_token']:>7.1f} us/token; chunks late p50 {r['late_ms_p50']:.1f} ms, "
                f"p99 {r['late_ms_p99']:.1f} ms"
            )
    outputs.write_json(args.results, "serving_live", figures)
    plot(figures, args.results)
    outputs.announce(args.results, "serving_live")
    return 0


if __name__ == "__main__":
    sys.exit(main())
