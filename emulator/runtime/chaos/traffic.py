"""Background requests to a serving workload during a scenario, through the router's OpenAI
endpoint, as a user's clients would send them: each one's outcome (ok or failed, TTFT, TPOT, the
emulated instant it ended) is what `failed_requests` and `slo` are judged on."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.chaos.observed import RequestSample
from cmemu.emulator.model.chaos.workloads import ServingLoad

REQUEST_TIMEOUT_S = 600.0  # wall: a request the emulator never answers is failed, not waited on
VOCAB_SPAN = 30_000


def _prompt(n: int, size: int) -> list[int]:
    return [(n * 7919 + 104729 * j) % VOCAB_SPAN + 1 for j in range(size)]


class Traffic:
    """Sends `load.rate_per_s` requests per emulated second to `model` until stopped."""

    def __init__(self, *, url: str, model: str, load: ServingLoad, clock: Timeline) -> None:
        self.url = f"{url.rstrip('/')}/v1/completions"
        self.model = model
        self.load = load
        self.clock = clock
        self.samples: list[RequestSample] = []
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session, asyncio.TaskGroup() as tg:
            gap_ns = round(1e9 / self.load.rate_per_s)
            next_ns = self.clock.now_ns()
            for n in itertools.count():
                tg.create_task(self._one(session, n), name=f"chaos-request-{n}")
                next_ns += gap_ns  # on emulated time: a slower rate sends them slower
                if await self.clock.wait(self._stop, next_ns):
                    return

    async def _one(self, session: aiohttp.ClientSession, n: int) -> None:
        body = {
            "model": self.model,
            "prompt": _prompt(n, self.load.input_tokens),
            "max_tokens": self.load.output_tokens,
            "ignore_eos": True,  # exactly that many tokens, as benchmark clients ask
        }
        try:
            async with session.post(self.url, json=body) as response:
                if response.status != 200:
                    text = await response.text()
                    self._failed(f"HTTP {response.status}: {text[:160]}")
                    return
                reply: dict[str, Any] = await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        self._done(reply)

    def _failed(self, error: str) -> None:
        self.samples.append(
            RequestSample(workload=self.model, ok=False, done_ns=self.clock.now_ns(), error=error)
        )

    def _done(self, reply: dict[str, Any]) -> None:
        timing = reply.get("cmemu", {})
        tokens = int(reply.get("usage", {}).get("completion_tokens", 0))
        finish = (reply.get("choices") or [{}])[0].get("finish_reason")
        ttft, tpot = int(timing.get("ttft_ns", 0)), int(timing.get("tpot_ns", 0))
        done = int(timing.get("arrival_ns", 0)) + ttft + tpot * max(tokens - 1, 0)
        ok = finish == "length" and tokens == self.load.output_tokens
        self.samples.append(
            RequestSample(
                workload=self.model,
                ok=ok,
                done_ns=done or self.clock.now_ns(),
                tpot_ms=tpot / 1e6,
                ttft_ms=ttft / 1e6,
                received_ns=self.clock.now_ns(),
                error=""
                if ok
                else f"finish {finish}, {tokens} of {self.load.output_tokens} tokens",
            )
        )
