"""Tenants of the Tokens service through the real endpoint (issue 24 item 3): API keys from a
keys file (401 without one), per-tenant usage that is the sum of the responses' `usage` (gRPC
GetUsage and /metrics), a quota and a rate limit answered 429, and priority classes: offline
work waits for idle capacity while online work goes straight in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import openai
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.tenants import Keys, parse_keys
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2
from tests.runtime.test_metrics import parse, scrape, value

ADMIN = "admin-key-0123456789abcdef"
KEYS = parse_keys(
    f"""
version = 1
admin = "{ADMIN}"
[tenants.acme]
key = "acme-key-0123456789abcdef"
[tenants.capped]
key = "capped-key-0123456789abcdef"
quota_tokens = 60
[tenants.slow]
key = "slow-key-0123456789abcdef"
requests_per_min = 1
[tenants.batch]
key = "batch-key-0123456789abcdef"
priority = "offline"
""",
    "test keys",
)
# offline work may hold one decode slot at a time (max(1, share x slots)): a second waits
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(
        DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0, tenant_offline_share=1e-9
    ),
)
SPEC = {
    "model": "deepseek-r1",
    "decode": {"npus": 2},
    "prefill": {"instances": 1, "npus": 2},
    "output": 1_000_000,
}


@dataclass
class Served:
    sn: Supernode
    base: str
    keys: Keys

    def client(self, tenant: str) -> openai.AsyncOpenAI:
        key = next(t.key for t in self.keys.tenants if t.name == tenant)
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[Served]:
    async with running_supernode("cm-mini", time_scale=20.0, profile=PROFILE, keys=KEYS) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(name="small", spec_yaml=json.dumps(SPEC), wait=True)
        )
        http = sn.topology.service(ServiceKind.ROUTER).http_address
        yield Served(sn=sn, base=f"http://{http}", keys=KEYS)


async def _usage(s: Served, tenant: str) -> router_pb2.TenantUsage:
    report = await s.sn.clients.router().GetUsage(router_pb2.GetUsageRequest(tenant=tenant))
    (one,) = report.tenants
    return one


async def test_the_endpoint_wants_a_tenants_key(served: Served) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": "small", "prompt": "hi", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": ADMIN}):
            async with session.post(
                f"{served.base}/v1/completions", json=body, headers=headers
            ) as response:
                assert response.status == 401
                assert (await response.json())["error"]["code"] == "invalid_api_key"
        async with session.get(f"{served.base}/v1/models") as response:
            assert response.status == 200  # reads stay open
    admin = served.client("default")  # the emulator's token is tenant `default`
    done = await admin.completions.create(model="small", prompt="hi", max_tokens=1)
    assert done.usage is not None
    await admin.close()


async def test_usage_is_the_sum_of_the_responses(served: Served) -> None:
    client = served.client("acme")
    before = await _usage(served, "acme")
    seen = {"prompt": 0, "completion": 0, "requests": 0}
    for i in range(3):
        done = await client.completions.create(
            model="small", prompt=f"question {i} " * (i + 1), max_tokens=4 + i
        )
        assert done.usage is not None
        seen["prompt"] += done.usage.prompt_tokens
        seen["completion"] += done.usage.completion_tokens
        seen["requests"] += 1
    stream = await client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "stream it"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.usage is not None:
            seen["prompt"] += chunk.usage.prompt_tokens
            seen["completion"] += chunk.usage.completion_tokens
            seen["requests"] += 1
    await client.close()
    after = await _usage(served, "acme")
    assert after.requests - before.requests == seen["requests"] == 4
    assert after.prompt_tokens - before.prompt_tokens == seen["prompt"]
    assert after.completion_tokens - before.completion_tokens == seen["completion"]
    assert after.priority == "online" and after.total_tokens == (
        after.prompt_tokens + after.completion_tokens
    )
    url = next(iter(supernode_endpoints(served.sn).values()))
    families = parse(await scrape(url))
    billed = value(families, "cmemu_tenant_completion_tokens_total", tenant="acme")
    assert billed == after.completion_tokens


async def test_a_quota_and_a_rate_limit_answer_429(served: Served) -> None:
    capped = served.client("capped")
    with pytest.raises(openai.RateLimitError) as err:
        for _ in range(20):  # 60 tokens: a few requests of about 10
            await capped.completions.create(model="small", prompt="a b c d", max_tokens=8)
    assert err.value.status_code == 429 and err.value.code == "insufficient_quota"
    assert "retry-after" not in err.value.response.headers
    use = await _usage(served, "capped")
    assert use.total_tokens <= 60 and use.rejected == 1 and use.quota_tokens == 60
    await capped.close()

    slow = served.client("slow")
    await slow.completions.create(model="small", prompt="one", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as err:
        await slow.completions.create(model="small", prompt="two", max_tokens=1)
    assert err.value.code == "rate_limit_exceeded"
    # a minute of emulated time: 3 s of wall time at time scale 20, more when the emulator's
    # clock runs slower than asked (a busy host), never less
    assert int(err.value.response.headers["retry-after"]) >= 3
    await slow.close()
    with pytest.raises(Exception) as unknown:
        await _usage(served, "nobody")
    assert "TENANT_NOT_FOUND" in str(unknown.value) or "no tenant" in str(unknown.value)


async def _timed(client: openai.AsyncOpenAI, tokens: int) -> tuple[int, int]:
    """(arrival, last token) of a streamed completion, emulated ns."""
    stream = await client.completions.create(
        model="small", prompt="long work", max_tokens=tokens, stream=True
    )
    last: dict[str, Any] = {}
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason is not None:
            last = (chunk.model_extra or {})["cmemu"]
    return int(last["arrival_ns"]), int(last["emulated_ns"])


async def test_offline_work_waits_for_idle_capacity(served: Served) -> None:
    """Two offline requests sent together run one after the other; an online one sent with
    them does not wait behind them; two online requests sent together overlap (the case that
    shows the waiting is the class's, not the deployment's)."""
    batch, acme = served.client("batch"), served.client("acme")
    tokens = 100  # seconds of emulated decode: the requests sent together meet in flight
    (a0, a1), (b0, b1), (c0, _) = await asyncio.gather(
        _timed(batch, tokens), _timed(batch, tokens), _timed(acme, tokens)
    )
    first_end, second_start = min(a1, b1), max(a0, b0)
    assert second_start >= first_end  # offline: one at a time
    assert c0 < second_start  # online: straight in
    (d0, d1), (e0, e1) = await asyncio.gather(_timed(acme, tokens), _timed(acme, tokens))
    assert max(d0, e0) < min(d1, e1)  # online: side by side
    await batch.close()
    await acme.close()
