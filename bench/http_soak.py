"""A soak of the OpenAI endpoint (issue 21): normal serving and hostile HTTP at once, for ten
minutes by default. Normal traffic: an online tenant's streamed completions, a few at a time,
each judged against the deployment's SLOs on its emulated timing (TTFT within
`prefill.ttft_target_s`, TPOT within `decode.tpot_target_s`). Hostile traffic, from a second,
offline tenant and from no tenant at all: valid requests with a hostile field, corrupt, deep and
oversized bodies, odd routes and headers (bench/hostile_http.py), 401s, and connections that
open and never speak. The run passes when every normal request completed within its SLOs, no
answer was a 5xx, and nothing hung (every answer within 10 s of wall time, streams excepted).

cm-mini runs in this process; weights load in a second (PROFILE). SLO attainment is judged on
emulated time, so a busy host slows the run but cannot fail it; how far the endpoint fell behind
the wall clock is reported (the share of tokens released late, from /metrics).

    python bench/http_soak.py [--seconds 600] [--streams 4] [--hostile 4] [--results DIR]
    python bench/http_soak.py --seconds 5            # the quickest

Writes bench/results/http_soak.json and bench/results/http_soak.png; exit 1 when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.tenants import parse_keys
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block
from cmemu.v1 import router_pb2

try:
    from bench import hostile_http, outputs
    from bench.clients import _families, late_share
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import hostile_http  # type: ignore[import-not-found, no-redef]
    import outputs  # type: ignore[import-not-found, no-redef]
    from clients import _families, late_share  # type: ignore[import-not-found, no-redef]

HANG_S = 10.0
MODEL = "soak"
ONLINE_KEY = "online-key-0123456789abcdef"
OFFLINE_KEY = "offline-key-0123456789abcdef"
KEYS = parse_keys(
    f"""
version = 1
admin = "admin-key-0123456789abcdef"
[tenants.online]
key = "{ONLINE_KEY}"
[tenants.untrusted]
key = "{OFFLINE_KEY}"
priority = "offline"
""",
    "http_soak",
)
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=1.0, cache_from_ems_s=0.5),
    # answers of at most 16 tokens (a hostile request without max_tokens is then a second of
    # emulated work, not minutes) and silent connections closed after 5 s (not 75 s): the
    # soak's quick mode sees them closed
    limits=replace(DEFAULT_PROFILE.limits, max_tokens_max=16, http_idle_s=5.0),
)
# decode 8 NPUs, prefill 1x4: SLOs this size meets when nothing else runs (emulated)
SPEC = {
    "model": "deepseek-r1",
    "decode": {"npus": 8, "tpot_target_s": 0.25},
    "prefill": {"instances": 1, "npus": 4, "ttft_target_s": 2.0},
}
NORMAL_TOKENS = 16  # at most limits.max_tokens_max here


@dataclass
class Tally:
    normal: int = 0
    within_slo: int = 0
    normal_failed: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    hostile: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    server_errors: list[str] = field(default_factory=list)
    not_openai: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    silent_closed: int = 0
    silent_opened: int = 0


async def _normal(
    session: aiohttp.ClientSession, base: str, i: int, tally: Tally, slo: tuple[float, float]
) -> None:
    body = {
        "model": MODEL,
        "prompt": f"request {i}: tell me about the unified bus of the supernode. " * 8,
        "max_tokens": NORMAL_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {ONLINE_KEY}"}
    timing: dict[str, Any] = {}
    async with session.post(f"{base}/v1/completions", json=body, headers=headers) as response:
        if response.status != 200:
            tally.normal_failed.append(f"HTTP {response.status}: {await response.text()}")
            return
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["finish_reason"] is not None:
                    timing = chunk["cmemu"]
    tally.normal += 1
    ttft, tpot = timing.get("ttft_ns"), timing.get("tpot_ns")
    if ttft is None or tpot is None:
        tally.normal_failed.append(f"no timing: {timing}")
        return
    tally.ttft_s.append(ttft / 1e9)
    tally.tpot_s.append(tpot / 1e9)
    if ttft / 1e9 <= slo[0] and tpot / 1e9 <= slo[1]:
        tally.within_slo += 1
    else:
        tally.normal_failed.append(
            f"SLO missed: TTFT {ttft / 1e6:.0f} ms, TPOT {tpot / 1e6:.1f} ms"
        )


async def _hostile(
    session: aiohttp.ClientSession, base: str, case: hostile_http.Case, tally: Tally
) -> None:
    method, path, body, headers = case
    what = f"{method} {path[:60]} {body[:100]!r}"
    try:
        async with asyncio.timeout(HANG_S):
            async with session.request(method, f"{base}{path}", data=body, headers=headers) as r:
                raw = await r.read()
                status = r.status
    except TimeoutError:
        tally.hangs.append(what)
        return
    except aiohttp.ClientError as exc:  # the server closed on a request it could not read
        tally.statuses[0] += 1
        tally.hostile += 1
        del exc
        return
    tally.hostile += 1
    tally.statuses[status] += 1
    if status >= 500:
        tally.server_errors.append(f"{status}: {what}: {raw[:200]!r}")
    elif status >= 400 and not hostile_http.is_openai_error(status, raw):
        tally.not_openai.append(f"{status}: {what}: {raw[:200]!r}")


async def _silent(host: str, port: int, tally: Tally) -> None:
    """A connection that opens and never speaks: the server must close it (http_idle_s)."""
    reader, writer = await asyncio.open_connection(host, port)
    tally.silent_opened += 1
    try:
        async with asyncio.timeout(PROFILE.limits.http_idle_s + 30):
            await reader.read()
        tally.silent_closed += 1
    except TimeoutError:
        tally.hangs.append("a silent connection was never closed")
    finally:
        writer.close()


def _tenant_headers(rng: random.Random) -> dict[str, str]:
    return rng.choice(
        [
            {"Authorization": f"Bearer {OFFLINE_KEY}"},
            {"Authorization": f"Bearer {OFFLINE_KEY}"},
            {},
            {"Authorization": "Bearer not-a-key"},
        ]
    )


async def soak(seconds: float, streams: int, hostile: int, seed: int) -> dict[str, Any]:
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(server_count(build("cm-mini"))))),
        profile=PROFILE,
        broker="none",
        drain_s=0.0,
        token=KEYS.admin,
        keys=KEYS,
    )
    tally = Tally()
    async with Supernode.start(options) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(name=MODEL, spec_yaml=json.dumps(SPEC), wait=True)
        )
        address = sn.topology.service(ServiceKind.ROUTER).http_address
        assert address is not None
        base = f"http://{address}"
        host, port = address.rsplit(":", 1)
        slo = (SPEC["prefill"]["ttft_target_s"], SPEC["decode"]["tpot_target_s"])  # type: ignore[index]
        rng = random.Random(seed)
        started = time.monotonic()
        deadline = started + seconds
        counter = iter(range(10**9))

        async def normal_lane(session: aiohttp.ClientSession) -> None:
            while time.monotonic() < deadline:
                await _normal(session, base, next(counter), tally, slo)

        async def hostile_lane(session: aiohttp.ClientSession) -> None:
            pool: list[hostile_http.Case] = []
            while time.monotonic() < deadline:
                if not pool:
                    pool = hostile_http.cases(rng, MODEL, 40)
                    rng.shuffle(pool)
                method, path, body, headers = pool.pop()
                case = (method, path, body, {**headers, **_tenant_headers(rng)})
                await _hostile(session, base, case, tally)

        async def silent_lane() -> None:
            while time.monotonic() < deadline:
                await _silent(host, int(port), tally)

        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as session, asyncio.TaskGroup() as g:
            for _ in range(streams):
                g.create_task(normal_lane(session))
            for _ in range(hostile):
                g.create_task(hostile_lane(session))
            g.create_task(silent_lane())
        wall = time.monotonic() - started
        (metrics_url,) = supernode_endpoints(sn).values()
        late = late_share(await _families(metrics_url), PROFILE.limits.release_lag_tolerance_s)
        usage = await sn.clients.router().GetUsage(router_pb2.GetUsageRequest())
    return _summary(tally, wall, late, {t.tenant: t for t in usage.tenants})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _summary(tally: Tally, wall: float, late: float, usage: dict[str, Any]) -> dict[str, Any]:
    passed = (
        tally.normal > 0
        and tally.within_slo == tally.normal
        and not tally.normal_failed
        and not tally.server_errors
        and not tally.hangs
        and not tally.not_openai
    )
    return {
        "passed": passed,
        "wall_s": wall,
        "normal": {
            "requests": tally.normal,
            "within_slo": tally.within_slo,
            "failures": tally.normal_failed[:20],
            "ttft_ms_p50": _pct(tally.ttft_s, 0.5) * 1e3,
            "ttft_ms_p99": _pct(tally.ttft_s, 0.99) * 1e3,
            "tpot_ms_p50": _pct(tally.tpot_s, 0.5) * 1e3,
            "tpot_ms_p99": _pct(tally.tpot_s, 0.99) * 1e3,
        },
        "hostile": {
            "requests": tally.hostile,
            "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
            "server_errors": tally.server_errors[:20],
            "not_openai_errors": tally.not_openai[:20],
            "hangs": tally.hangs[:20],
            "silent_connections": {"opened": tally.silent_opened, "closed": tally.silent_closed},
        },
        "late_token_share": late,
        "billed": {
            name: {"requests": u.requests, "total_tokens": u.total_tokens, "rejected": u.rejected}
            for name, u in usage.items()
        },
    }


def report(doc: dict[str, Any]) -> None:
    n, h = doc["normal"], doc["hostile"]
    print(
        f"http soak, {doc['wall_s']:.0f} s: {'PASSED' if doc['passed'] else 'FAILED'}; "
        f"{doc['late_token_share']:.1%} of tokens released late"
    )
    print(
        f"  normal: {n['requests']} requests, {n['within_slo']} within the SLOs; TTFT ms p50 "
        f"{n['ttft_ms_p50']:.0f} p99 {n['ttft_ms_p99']:.0f}; TPOT ms p50 {n['tpot_ms_p50']:.1f} "
        f"p99 {n['tpot_ms_p99']:.1f}"
    )
    print(
        f"  hostile: {h['requests']} requests {h['statuses']}; 5xx {len(h['server_errors'])}, "
        f"not OpenAI errors {len(h['not_openai_errors'])}, hangs {len(h['hangs'])}; silent "
        f"connections closed {h['silent_connections']['closed']} of "
        f"{h['silent_connections']['opened']}"
    )
    for line in [*n["failures"], *h["server_errors"], *h["not_openai_errors"], *h["hangs"]][:10]:
        print(f"  ! {line}")


def plot(doc: dict[str, Any], directory: Path) -> None:
    statuses = doc["hostile"]["statuses"]
    with outputs.figure(directory, "http_soak", ncols=2, size=(10, 4), dpi=100) as (left, right):
        outputs.bars(
            left,
            ["TTFT p50", "TTFT p99"],
            {"ms (emulated)": [doc["normal"]["ttft_ms_p50"], doc["normal"]["ttft_ms_p99"]]},
            targets={"SLO": SPEC["prefill"]["ttft_target_s"] * 1e3},  # type: ignore[index]
            title=f"normal requests ({doc['normal']['requests']})",
        )
        outputs.bars(
            right,
            list(statuses),
            {"answers": list(statuses.values())},
            title="hostile requests by status (0: connection closed)",
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--streams", type=int, default=4, help="normal requests at a time")
    parser.add_argument("--hostile", type=int, default=4, help="hostile requests at a time")
    parser.add_argument("--seed", type=int, default=21)
    outputs.add_option(parser)
    args = parser.parse_args()
    if not args.seconds > 0 or args.streams < 1 or args.hostile < 0:
        parser.error("--seconds must be > 0, --streams >= 1, --hostile >= 0")
    configure_logging("error")
    doc = asyncio.run(soak(args.seconds, args.streams, args.hostile, args.seed))
    doc["settings"] = {"seconds": args.seconds, "streams": args.streams, "hostile": args.hostile}
    report(doc)
    outputs.write_json(args.results, "http_soak", doc)
    plot(doc, args.results)
    outputs.announce(args.results, "http_soak")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
