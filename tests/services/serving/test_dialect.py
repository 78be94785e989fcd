"""The OpenAI endpoint as benchmark clients meet it (issue 24 items 1-2) and under hostile input
(issue 21 findings 1, 2, 5, 9, 11), through the real `openai` client and raw HTTP against an
in-process cm-mini with tight limits. Each hardening case was a hang, a 500 or a whole echo
before; the normal request after it shows the endpoint still serves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import grpc
import openai
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.services.router import RouterState
from cmemu.services.serving.tokenizer import HfTokenizer, load_tokenizer
from cmemu.v1 import router_pb2, training_pb2

LIMITS = replace(
    DEFAULT_PROFILE.limits,
    prompt_bytes_max=64 * 1024,
    content_parts_max=8,
    messages_max=16,
    choices_max=8,
    http_body_max_bytes=256 * 1024,
    json_depth_max=16,
    http_idle_s=1.0,
    max_tokens_max=200_000,  # past the context: the context is what refuses here
)
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
    limits=LIMITS,
)
TIME_SCALE = 20.0
CONTEXT = 163_840
BASE = {"model": "deepseek-r1", "decode": {"npus": 2}, "prefill": {"instances": 1, "npus": 2}}
EOS = {**BASE, "output": 3}  # every answer would end after 3 tokens by itself
LONG = {**BASE, "output": 1_000_000}  # answers run to max_tokens


@dataclass
class Endpoint:
    sn: Supernode
    state: RouterState
    base: str  # http://host:port
    client: openai.AsyncOpenAI
    tok: HfTokenizer


@pytest.fixture(scope="module")
async def ep() -> AsyncIterator[Endpoint]:
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as sn:
        stub = sn.clients.router()
        for name, spec in (("eos", EOS), ("long", LONG)):
            await stub.Deploy(
                router_pb2.DeployRequest(name=name, spec_yaml=json.dumps(spec), wait=True)
            )
        http = sn.topology.service(ServiceKind.ROUTER).http_address
        client = openai.AsyncOpenAI(base_url=f"http://{http}/v1", api_key="none", max_retries=0)
        assert sn.local is not None
        state = sn.local.service_state(ServiceKind.ROUTER)
        assert isinstance(state, RouterState)
        tok = load_tokenizer().tokenizer
        assert isinstance(tok, HfTokenizer)
        yield Endpoint(sn=sn, state=state, base=f"http://{http}", client=client, tok=tok)
        await client.close()


async def _raw(
    ep: Endpoint, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, Any], dict[str, str], int]:
    """(status, JSON body, headers, body length) of one raw request."""
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(20):
            async with session.request(
                method,
                f"{ep.base}{path}",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as response:
                raw = await response.read()
                return response.status, json.loads(raw), dict(response.headers), len(raw)


async def _post(ep: Endpoint, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    status, data, _, _ = await _raw(ep, "POST", path, json.dumps(body).encode())
    return status, data


async def _still_serves(ep: Endpoint) -> None:
    done = await ep.client.completions.create(
        model="long", prompt="still there?", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None and done.usage.completion_tokens == 3


# --- the dialect ---------------------------------------------------------------------------------


async def test_models_carry_the_context_and_can_be_retrieved(ep: Endpoint) -> None:
    listed = await ep.client.models.list()
    cards = {m.id: m for m in listed.data}
    assert set(cards) == {"eos", "long"}
    assert all((m.model_extra or {})["max_model_len"] == CONTEXT for m in cards.values())
    one = await ep.client.models.retrieve("long")
    assert one.id == "long" and (one.model_extra or {})["cmemu"]["exact_token_counts"] is True
    with pytest.raises(openai.NotFoundError):
        await ep.client.models.retrieve("nope")
    status, body, _, size = await _raw(ep, "GET", "/v1/models/" + "x" * 10_000)  # finding 9
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert size < 600, size


async def test_unknown_routes_and_methods_answer_openai_errors(ep: Endpoint) -> None:
    status, body, _, _ = await _raw(ep, "GET", "/v1/embeddings")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body, headers, _ = await _raw(ep, "GET", "/v1/completions")
    assert status == 405 and headers["Allow"] == "POST" and "error" in body
    status, body, _, _ = await _raw(ep, "DELETE", "/v1/models")
    assert status == 405 and body["error"]["message"].startswith("DELETE is not allowed")


async def test_usage_counts_are_the_tokenizers(ep: Endpoint) -> None:
    prompt = "Tell me how the unified bus reaches every die of the supernode. " * 10
    whole = await ep.client.completions.create(
        model="long", prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert whole.usage is not None and whole.usage.prompt_tokens == len(ep.tok.encode(prompt))
    messages: list[Any] = [
        {"role": "system", "content": "terse"},
        {"role": "user", "content": prompt},
    ]
    chat = await ep.client.chat.completions.create(
        model="long", messages=messages, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(ep.tok.chat(messages))
    ids = ep.tok.encode(prompt)
    status, body = await _post(
        ep, "/v1/completions", {"model": "long", "prompt_token_ids": ids, "max_tokens": 2}
    )
    assert status == 200 and body["usage"]["prompt_tokens"] == len(ids)
    # the streamed text (one or more tokens a chunk) re-encodes to completion_tokens
    stream = await ep.client.completions.create(
        model="long",
        prompt=prompt,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, counted, usage = "", 0, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.finish_reason is None:
                text += choice.text
                counted += (chunk.model_extra or {})["cmemu"]["count"]
    assert usage is not None and usage.completion_tokens == counted == 40
    assert len(ep.tok.encode(text)) == 40


async def test_answers_end_at_eos_unless_ignored(ep: Endpoint) -> None:
    async def one(**extra: Any) -> tuple[int, str]:
        done = await ep.client.completions.create(
            model="eos", prompt="hi", max_tokens=extra.pop("max_tokens", 10), extra_body=extra
        )
        assert done.usage is not None
        return done.usage.completion_tokens, done.choices[0].finish_reason

    assert await one() == (3, "stop")  # the deployment's output-length model
    assert await one(ignore_eos=True) == (10, "length")
    assert await one(min_tokens=6) == (6, "stop")
    assert await one(max_tokens=2) == (2, "length")
    status, body = await _post(ep, "/v1/completions", {"model": "eos", "prompt": "no max"})
    assert status == 200 and body["usage"]["completion_tokens"] == 3  # drawn, not 16
    status, body = await _post(
        ep, "/v1/completions", {"model": "eos", "prompt": "x", "max_tokens": 2, "min_tokens": 3}
    )
    assert status == 400 and body["error"]["param"] == "min_tokens"


async def test_a_stop_string_ends_the_answer_before_it(ep: Endpoint) -> None:
    done = await ep.client.completions.create(
        model="long", prompt="hi", max_tokens=300, stop=[" memory"], seed=5
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and " memory" not in choice.text
    assert done.usage is not None and 0 < done.usage.completion_tokens < 300
    # the text before the stop string: one token fewer than generated
    assert len(ep.tok.encode(choice.text)) == done.usage.completion_tokens - 1


async def test_n_and_prompt_lists_give_one_choice_each(ep: Endpoint) -> None:
    prompts = ["first prompt here", "a second, longer prompt than the first"]
    done = await ep.client.completions.create(
        model="long", prompt=prompts, n=2, max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in done.choices) == [0, 1, 2, 3]
    assert all(len(ep.tok.encode(c.text)) == 4 for c in done.choices)
    assert done.usage is not None
    assert done.usage.prompt_tokens == sum(len(ep.tok.encode(p)) for p in prompts)
    assert done.usage.completion_tokens == 16
    chat = await ep.client.chat.completions.create(
        model="long",
        messages=[{"role": "user", "content": "two answers"}],
        n=2,
        max_tokens=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    finished: dict[int, str] = {}
    async for chunk in chat:
        for c in chunk.choices:
            if c.finish_reason is not None:
                finished[c.index] = c.finish_reason
    assert finished == {0: "length", 1: "length"}
    status, body = await _post(ep, "/v1/completions", {"model": "long", "prompt": "x", "n": 9})
    assert status == 400 and body["error"]["param"] == "n"  # choices_max is 8 here


async def test_a_seed_repeats_the_answer_and_sampling_is_checked(ep: Endpoint) -> None:
    async def text(seed: int) -> str:
        done = await ep.client.completions.create(
            model="eos", prompt="hi", max_tokens=20, seed=seed, temperature=0.7, top_p=0.9
        )
        return done.choices[0].text

    assert await text(11) == await text(11)
    assert len({await text(s) for s in (1, 2, 3, 4)}) > 1
    for bad in ({"temperature": 3}, {"top_p": -0.1}, {"presence_penalty": "x"}):
        status, body = await _post(
            ep, "/v1/completions", {"model": "eos", "prompt": "x", "max_tokens": 1, **bad}
        )
        assert status == 400 and body["error"]["param"] == next(iter(bad))


# --- hardening (issue 21) ---------------------------------------------------------------------


async def test_max_tokens_beyond_the_context_is_refused(ep: Endpoint) -> None:
    """Finding 1: 2**63 hung the request, raised in the engine and held a KV slot."""
    for value in ("9223372036854775808", "1000000000000000000", "1" + "0" * 400, str(CONTEXT)):
        raw = f'{{"model": "long", "prompt": "hello", "max_tokens": {value}}}'.encode()
        status, body, _, _ = await _raw(ep, "POST", "/v1/completions", raw)
        assert status == 400, (value[:20], body)
        assert body["error"]["param"] == "max_tokens"
    status, body = await _post(
        ep, "/v1/completions", {"model": "long", "prompt": "hello", "max_tokens": CONTEXT}
    )
    assert body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 163840 tokens" in body["error"]["message"]
    status, body = await _post(
        ep, "/v1/completions", {"model": "long", "prompt": "hello", "max_tokens": 200_001}
    )
    assert status == 400 and body["error"]["message"] == "max_tokens is at most 200,000"
    await _still_serves(ep)
    stats = await ep.sn.clients.router().GetStats(router_pb2.GetStatsRequest(name="long"))
    assert stats.requests_dropped == 0 and stats.requests_in_flight == 0


async def test_prompts_beyond_the_limits_are_refused(ep: Endpoint) -> None:
    """Finding 2: a 20 MB prompt, 1M token ids, 100k content parts, a 1 MB role."""
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("/v1/completions", {"prompt": "word " * 20_000}, 413, "prompt"),
        ("/v1/completions", {"prompt": [7] * 40_000}, 413, "prompt"),
        ("/v1/completions", {"prompt": ["x"] * 9}, 400, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 9}]},
            400,
            "messages",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "r" * 200_000, "content": "x"}]}, 400, ""),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 17}, 400, ""),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages",
        ),
    ]
    for path, extra, code, param in cases:
        status, body, _, size = await _raw(
            ep, "POST", path, json.dumps({"model": "long", "max_tokens": 2, **extra}).encode()
        )
        assert status == code, (path, list(extra), body)
        assert size < 1000  # a 200 kB role is not echoed (1 MB: 413)
        if param:
            assert body["error"]["param"] == param
    # the body itself: 413 before it is read whole
    huge = json.dumps({"model": "long", "prompt": "y" * 300_000}).encode()
    status, body, _, _ = await _raw(ep, "POST", "/v1/completions", huge)
    assert status == 413 and "error" in body
    await _still_serves(ep)


async def test_deep_json_is_a_400(ep: Endpoint) -> None:
    """Finding 5: 100,000 '[' was a 500 (RecursionError)."""
    nested: Any = [1]
    for _ in range(17):
        nested = [nested]
    for body in (b"[" * 100_000, json.dumps({"model": "long", "prompt": nested}).encode()):
        status, data, _, _ = await _raw(ep, "POST", "/v1/completions", body)
        assert status == 400 and "nests deeper than 16" in data["error"]["message"]
    await _still_serves(ep)


async def test_long_names_are_not_echoed_whole(ep: Endpoint) -> None:
    """Finding 9: a 20k-character name came back whole in GetDeployment's and Training/Get's
    NOT_FOUND."""
    name = "n" * 20_000
    router = ep.sn.clients.router()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await router.GetDeployment(router_pb2.GetDeploymentRequest(name=name))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert len(err.value.details() or "") < 400
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ep.sn.clients.training().Get(training_pb2.TrainingRequest(name=name))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert len(err.value.details() or "") < 400


async def test_silent_connections_are_closed(ep: Endpoint) -> None:
    """Finding 11: half-open connections were never timed out (http_idle_s is 1 s here)."""
    host, port = ep.base.removeprefix("http://").rsplit(":", 1)
    silent = await asyncio.open_connection(host, int(port))
    half = await asyncio.open_connection(host, int(port))
    half[1].write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    for reader, writer in (silent, half):
        async with asyncio.timeout(30):  # generous: the server closes after about 1 s
            leftover = await reader.read()
        assert leftover == b""  # closed by the server, nothing answered
        writer.close()
