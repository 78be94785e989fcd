"""Replaying a workload against the live OpenAI endpoint, as serving benchmark tools do.

Each request is sent at its arrival time (emulated seconds from the replay's start, divided by
`speed`, paced on the wall clock by the supernode's time_scale) as a streamed completion of
token ids: whole blocks from its block keys (so requests sharing a prefix share ids, and EMS's
prefix keys hit), the rest unique to it. TTFT, TPOT and prefix hits come from the emulated
timing each response carries; goodput counts the requests within the deployment's SLOs.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.report import Percentiles
from cmemu.emulator.model.serving.tokens import VOCAB, block_tokens

MAX_CONNECTIONS = 1000


def prompt_ids(request: Request, block: int) -> list[int]:
    """Token ids for a request: its full blocks from the block keys, the rest from its id."""
    seeds = [zlib.crc32(k.encode()) for k in request.block_keys]
    ids = block_tokens(seeds, len(seeds) * block, block)
    tail = request.input_tokens - len(ids)
    seed = zlib.crc32(request.id.encode())
    ids += [(seed + 7919 * j) % VOCAB for j in range(max(0, tail))]
    return ids[: request.input_tokens]


@dataclass(kw_only=True)
class Outcome:
    """One replayed request, in emulated nanoseconds."""

    id: str
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    arrival_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    ttft_ns: int = 0
    tpot_ns: int = 0
    prefix_hit_tokens: int = 0


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, request: Request, block: int
) -> Outcome:
    body = {
        "model": model,
        "prompt": prompt_ids(request, block),
        "max_tokens": request.output_tokens,
        "ignore_eos": True,  # the trace says how many tokens, as benchmark clients ask
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = Outcome(id=request.id, ok=False, prompt_tokens=request.input_tokens)
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                text = await response.text()
                out.error = f"HTTP {response.status}: {text[:200]}"
                return out
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                _take(out, json.loads(line[len("data: ") :]))
    except aiohttp.ClientError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.ok = out.completion_tokens == request.output_tokens and not out.error
    if not out.ok and not out.error:
        out.error = f"{out.completion_tokens} of {request.output_tokens} tokens"
    return out


def _take(out: Outcome, chunk: dict[str, Any]) -> None:
    error = chunk.get("error")
    if error:  # the request failed visibly (finish_reason "error" came before)
        out.error = str(error.get("message", error)) if isinstance(error, dict) else str(error)
        return
    usage = chunk.get("usage")
    if usage:
        out.completion_tokens = usage["completion_tokens"]
        out.prompt_tokens = usage["prompt_tokens"]
        return
    timing = chunk.get("cmemu", {})
    choices = chunk.get("choices") or [{}]
    if choices[0].get("finish_reason") is None:
        out.first_ns = out.first_ns or timing.get("emulated_ns", 0)
        out.last_ns = timing.get("emulated_ns", out.last_ns)
        return
    out.arrival_ns = timing.get("arrival_ns") or 0
    out.ttft_ns = timing.get("ttft_ns") or 0
    out.tpot_ns = timing.get("tpot_ns") or 0
    out.prefix_hit_tokens = timing.get("prefix_hit_tokens") or 0


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    requests: int
    completed: int
    failed: int
    emulated_s: float  # first arrival to last token
    wall_s: float
    output_tokens: int
    tokens_per_s: float  # output tokens per emulated second
    ttft_s: Percentiles
    tpot_s: Percentiles
    prefix_hit_rate: float  # prompt tokens found in EMS / prompt tokens
    slo_attainment: float  # completed requests within both targets
    goodput_per_s: float  # such requests per emulated second
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def report(
    outcomes: Sequence[Outcome], *, ttft_target_s: float, tpot_target_s: float, wall_s: float
) -> ReplayReport:
    done = [o for o in outcomes if o.ok]
    start = min((o.arrival_ns for o in done), default=0)
    end = max((o.last_ns for o in done), default=0)
    span = max(end - start, 1) / 1e9
    tokens = sum(o.completion_tokens for o in done)
    good = [
        o for o in done if o.ttft_ns / 1e9 <= ttft_target_s and o.tpot_ns / 1e9 <= tpot_target_s
    ]
    prompt = sum(o.prompt_tokens for o in done)
    return ReplayReport(
        requests=len(outcomes),
        completed=len(done),
        failed=len(outcomes) - len(done),
        emulated_s=span if done else 0.0,
        wall_s=wall_s,
        output_tokens=tokens,
        tokens_per_s=tokens / span if done else 0.0,
        ttft_s=Percentiles.of([o.ttft_ns / 1e9 for o in done]),
        tpot_s=Percentiles.of([o.tpot_ns / 1e9 for o in done if o.completion_tokens > 1]),
        prefix_hit_rate=sum(o.prefix_hit_tokens for o in done) / prompt if prompt else 0.0,
        slo_attainment=len(good) / len(done) if done else 0.0,
        goodput_per_s=len(good) / span if done else 0.0,
        errors=sorted({o.error for o in outcomes if o.error})[:10],
    )


async def replay(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    clock: Timeline,
    block: int,
    speed: float = 1.0,
    api_key: str | None = None,
    ca_pem: bytes | None = None,
) -> list[Outcome]:
    """Send every request at its (scaled) arrival time; their outcomes, in request order. With
    `api_key` as the bearer key; over HTTPS the server is checked against `ca_pem`."""
    if not speed > 0:
        raise InvalidArgumentError(f"speed must be > 0, got {speed}", field="speed")
    url = f"{base_url.rstrip('/')}/v1/completions"
    t0 = min((r.arrival_s for r in requests), default=0.0)
    context = ssl.create_default_context(cadata=ca_pem.decode()) if ca_pem else None
    connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=context or True)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        start_ns = clock.now_ns()

        async def later(request: Request) -> Outcome:
            # on the emulator's emulated time: a dilated emulator receives them slower
            await clock.sleep_until(start_ns + round((request.arrival_s - t0) / speed * 1e9))
            return await _one(session, url, model, request, block)

        return list(await asyncio.gather(*(later(r) for r in requests)))
