"""Offline work is preempted first (issue 24 item 3): on a deployment of 4 decode slots that
offline requests fill, an online arrival takes a slot at once (an offline request is cancelled
in the engine and later continues where it stopped, its client missing no token); the same
arrival behind online requests waits for one of them to end (the case that shows it is the
preemption that made room)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import openai
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.tenants import Keys, parse_keys
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import running_supernode
from cmemu.services.serving.tokenizer import load_tokenizer
from cmemu.v1 import router_pb2

KEYS = parse_keys(
    """
version = 1
admin = "admin-key-0123456789abcdef"
[tenants.acme]
key = "acme-key-0123456789abcdef"
[tenants.batch]
key = "batch-key-0123456789abcdef"
priority = "offline"
""",
    "test keys",
)
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(
        DEFAULT_PROFILE.serving, cache_cold_s=4.0, cache_from_ems_s=2.0, tenant_offline_share=1.0
    ),
)
SLOTS = 4  # 2 decode NPUs, 4 dies, one request each
SPEC = {
    "model": "deepseek-r1",
    "decode": {"npus": 2, "max_batch_per_die": 1},
    "prefill": {"instances": 1, "npus": 2},
}
LONG = 120  # tokens of a filler: seconds of emulated decode


@dataclass
class Clients:
    acme: openai.AsyncOpenAI
    batch: openai.AsyncOpenAI


def _client(base: str, keys: Keys, tenant: str) -> openai.AsyncOpenAI:
    key = next(t.key for t in keys.tenants if t.name == tenant)
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
async def clients() -> AsyncIterator[Clients]:
    async with running_supernode("cm-mini", time_scale=20.0, profile=PROFILE, keys=KEYS) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(name="small", spec_yaml=json.dumps(SPEC), wait=True)
        )
        base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}"
        c = Clients(acme=_client(base, KEYS, "acme"), batch=_client(base, KEYS, "batch"))
        await c.acme.completions.create(model="small", prompt="warm", max_tokens=1)
        yield c
        await c.acme.close()
        await c.batch.close()


@dataclass
class Run:
    decoding_ns: int = 0  # emulated instant of the first token from decode (the second token)
    end_ns: int = 0
    tokens: int = 0
    text: str = ""
    timing: dict[str, Any] | None = None


async def _stream(client: openai.AsyncOpenAI, tokens: int, started: asyncio.Event) -> Run:
    run = Run()
    stream = await client.completions.create(
        model="small",
        prompt="fill a decode slot",
        max_tokens=tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        extra = (chunk.model_extra or {})["cmemu"]
        choice = chunk.choices[0]
        if choice.finish_reason is None:
            if extra["index"] >= 1 and not run.decoding_ns:  # the first comes from prefill
                run.decoding_ns = extra["emulated_ns"]
            run.tokens += extra["count"]
            run.text += choice.text
            if run.decoding_ns:
                started.set()
        else:
            run.end_ns, run.timing = extra["emulated_ns"], extra
    return run


async def _fill_then_arrive(
    fillers: openai.AsyncOpenAI, arrival: openai.AsyncOpenAI
) -> tuple[list[Run], Run]:
    events = [asyncio.Event() for _ in range(SLOTS)]
    filling = [asyncio.create_task(_stream(fillers, LONG, e)) for e in events]
    for event in events:  # every slot taken: each filler is decoding
        await event.wait()
    late = await _stream(arrival, 5, asyncio.Event())
    return list(await asyncio.gather(*filling)), late


async def test_an_online_arrival_preempts_offline_work(clients: Clients) -> None:
    fillers, online = await _fill_then_arrive(clients.batch, clients.acme)
    assert online.tokens == 5
    # it decoded at once: the first token comes from prefill, the second needs a decode slot
    assert online.decoding_ns < min(f.end_ns for f in fillers)
    tok = load_tokenizer().tokenizer
    for f in fillers:  # every offline request still got all its tokens, text unbroken
        assert f.tokens == LONG and len(tok.encode(f.text)) == LONG
    assert sum(f.timing["preemptions"] for f in fillers if f.timing) == 1


async def test_an_online_arrival_behind_online_work_waits(clients: Clients) -> None:
    fillers, online = await _fill_then_arrive(clients.acme, clients.acme)
    assert online.decoding_ns >= min(f.end_ns for f in fillers)
    assert all(f.timing is not None and f.timing["preemptions"] == 0 for f in fillers)
