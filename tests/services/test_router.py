"""The router over real gRPC and HTTP against an in-process cm-mini: deploying (scheduler,
placement, weights through EMS), the OpenAI endpoint driven by the real `openai` client (streams,
usage, concurrency, cancellation, bad requests), and the emulated timing the chunks carry."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import aiomqtt
import grpc
import openai
import pytest

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.ems import prefix_keys
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import instance_dies, parse_deployment
from cmemu.emulator.model.serving.des import Oracle
from cmemu.emulator.model.serving.engine import Engine, Request, TokenEvent
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import EMBEDDED, NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block, running_supernode
from cmemu.services.router import RouterState
from cmemu.services.serving.tokenizer import load_tokenizer
from cmemu.v1 import ems_pb2, ems_pb2_grpc, router_pb2, router_pb2_grpc, scheduler_pb2
from tests.runtime.test_metrics import parse, scrape

# Weights load in emulated seconds rather than minutes, so that the supernode can run at a time
# scale where the router keeps up with emulated time (the timestamps are exact either way).
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
)
TIME_SCALE = 20.0
# a deployment of the default output model ends 1 answer in 18 before 3 tokens (its natural
# length): the tests that count tokens ask for max_tokens exactly
RUN_TO_MAX = {"ignore_eos": True}
# the openai client connects within 5 s by default: 48 streams at once from a loop that also
# runs the emulator, on a loaded host, have missed that (ConnectTimeout); a bound only
TIMEOUT = openai.Timeout(600.0, connect=120.0)
# answers run to max_tokens (a natural length beyond any asked): the tests count tokens
SMALL = {
    "model": "deepseek-r1",
    "decode": {"npus": 4},
    "prefill": {"instances": 1, "npus": 4},
    "output": 1_000_000,
}


@dataclass
class Router:
    sn: Supernode
    state: RouterState
    stub: router_pb2_grpc.RouterAsyncStub
    base_url: str
    openai: openai.AsyncOpenAI


def hosted_router(sn: Supernode) -> RouterState:
    """The router state the in-process launcher hosts (to look inside: stats, the engine)."""
    assert sn.local is not None
    state = sn.local.service_state(ServiceKind.ROUTER)
    assert isinstance(state, RouterState)
    return state


@pytest.fixture(scope="module")
async def router() -> AsyncIterator[Router]:
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as sn:
        state = hosted_router(sn)
        http = sn.topology.service(ServiceKind.ROUTER).http_address
        assert http is not None
        client = openai.AsyncOpenAI(
            base_url=f"http://{http}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
        )
        yield Router(
            sn=sn,
            state=state,
            stub=sn.clients.router(),
            base_url=f"http://{http}",
            openai=client,
        )
        await client.close()


async def _deploy(r: Router, name: str, **extra: Any) -> router_pb2.Deployment:
    request = router_pb2.DeployRequest(name=name, spec_yaml=json.dumps(SMALL), wait=True, **extra)
    return await r.stub.Deploy(request)


@pytest.fixture(scope="module")
async def small(router: Router) -> router_pb2.Deployment:
    return await _deploy(router, "small")


async def test_deploy_reports_instances_experts_and_weights(
    router: Router, small: router_pb2.Deployment
) -> None:
    assert small.state == router_pb2.DEPLOYMENT_STATE_SERVING
    assert [i.id for i in small.instances] == ["decode-0", "prefill-0"]
    assert small.npus == 8
    for inst in small.instances:
        assert len(inst.npus) == 4 and inst.dies == 8
        e = inst.experts
        assert e.ep == 8 and e.policy == "static"
        assert e.routed == 256 and e.shared + e.routed + e.redundant == 8 * e.slots_per_die
        assert e.imbalance >= 1.0
    w = small.weights
    assert w.bytes == 671_000_000_000 and w.cold_ns > w.from_ems_ns > 0
    assert w.loaded_ns > small.created_ns
    # the scheduler holds the NPUs under the deployment's jobs
    jobs = await router.sn.clients.scheduler().ListAllocations(
        scheduler_pb2.ListAllocationsRequest()
    )
    held = {a.job: [n.id for n in a.npus] for a in jobs.allocations}
    assert held["small.decode-0"] == list(small.instances[0].npus)
    # the weights are in EMS as size-only WEIGHTS objects
    ems = ems_pb2_grpc.EmsStub(
        router.sn.clients.channel_to(router.sn.topology.service(ServiceKind.EMS).address)
    )
    listed = await ems.List(ems_pb2.ListRequest(prefix="weights/deepseek-r1/"))
    assert sum(o.size for o in listed.objects) == w.bytes
    assert {o.kind for o in listed.objects} == {ems_pb2.OBJECT_KIND_WEIGHTS}


# --- the OpenAI endpoint ---------------------------------------------------------------------


def _extra(obj: Any) -> dict[str, Any]:
    extra = obj.model_extra or {}
    value = extra.get("cmemu")
    assert isinstance(value, dict)
    return value


@dataclass
class Streamed:
    text: str
    times_ns: list[int]  # emulated instant of each chunk's tokens
    counts: list[int]
    timing: dict[str, Any]  # the final chunk's request timing
    usage: Any


async def _stream(client: openai.AsyncOpenAI, prompt: str | list[int], max_tokens: int) -> Streamed:
    stream = await client.completions.create(
        model="small",
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    out = Streamed("", [], [], {}, None)
    async for chunk in stream:
        if chunk.usage is not None:
            out.usage = chunk.usage
            continue
        choice = chunk.choices[0]
        if choice.finish_reason is None:
            out.text += choice.text
            extra = _extra(chunk)
            out.times_ns.append(extra["emulated_ns"])
            out.counts.append(extra["count"])
        else:
            assert choice.finish_reason == "length"
            out.timing = _extra(chunk)
    return out


async def test_models_lists_the_deployments(router: Router, small: router_pb2.Deployment) -> None:
    models = await router.openai.models.list()
    assert "small" in [m.id for m in models.data]


async def test_streamed_completion_with_usage(router: Router, small: router_pb2.Deployment) -> None:
    prompt = "Tell me about the unified bus. " * 40
    out = await _stream(router.openai, prompt, 12)
    assert sum(out.counts) == 12 and out.text.strip()
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == len(load_tokenizer().tokenizer.encode(prompt))
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    assert out.times_ns == sorted(out.times_ns)
    assert out.timing["ttft_ns"] == out.times_ns[0] - out.timing["arrival_ns"] > 0
    assert out.timing["queueing_ns"] >= 0


async def test_whole_completion_and_chat(router: Router, small: router_pb2.Deployment) -> None:
    whole = await router.openai.completions.create(model="small", prompt="hello", max_tokens=5)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    assert len(whole.choices[0].text.split()) == 5
    chat = await router.openai.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "What is EMS?"}],
        max_completion_tokens=6,
    )
    assert chat.choices[0].message.role == "assistant"
    assert len((chat.choices[0].message.content or "").split()) == 6
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    stream = await router.openai.chat.completions.create(
        model="small",
        messages=[{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    roles, words, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            roles.append(choice.delta.role)
            words += (choice.delta.content or "").split()
    assert roles[0] == "assistant" and len(words) == 4
    assert usage is not None and usage.completion_tokens == 4


def _replay_pure(
    live: router_pb2.Deployment, spec: dict[str, Any], requests: list[Request], topology: Any
) -> dict[str, list[tuple[float, int]]]:
    """The same requests through the engine with every plan answered by the pure models (the
    simulator's oracle), on the live deployment's NPUs: each request's (time, count) of tokens."""
    deployment = parse_deployment({**spec, "preset": topology.preset}, PROFILE)
    oracle = Oracle(deployment, topology, PROFILE)
    oracle.layout = {i.id: tuple(i.npus) for i in live.instances}
    oracle.dies = {k: instance_dies(v) for k, v in oracle.layout.items()}
    engine = Engine(deployment, profile=PROFILE)
    tokens: dict[str, list[tuple[float, int]]] = {r.id: [] for r in requests}
    pending = sorted(requests, key=lambda r: r.arrival_s)
    while True:
        due = engine.next_due_time()
        now = min([*([pending[0].arrival_s] if pending else []), *([due] if due else [])],
                  default=None)  # fmt: skip
        if now is None:
            return tokens
        while pending and pending[0].arrival_s <= now:
            engine.submit(pending.pop(0), now)
        step = engine.advance(now)
        for event in step.events:
            if isinstance(event, TokenEvent):
                tokens[event.request_id].append((event.time_s, event.count))
        for plan in step.plans:
            engine.report(plan.id, oracle.answer(plan))


async def test_concurrent_streams_are_timed_as_the_engine_computes(
    router: Router, small: router_pb2.Deployment
) -> None:
    prompts = [[(97 * i + j) % 1000 + 1 for j in range(600 + 40 * i)] for i in range(48)]
    outs = await asyncio.gather(*(_stream(router.openai, p, 20 + i) for i, p in enumerate(prompts)))
    requests = [
        Request(
            id=out.timing["request"],
            arrival_s=out.timing["arrival_ns"] / 1e9,
            input_tokens=len(p),
            output_tokens=20 + i,
            block_keys=tuple(prefix_keys(p, 512, "small")),
        )
        for i, (p, out) in enumerate(zip(prompts, outs, strict=True))
    ]
    expected = _replay_pure(small, SMALL, requests, router.sn.topology)
    for request, out in zip(requests, outs, strict=True):
        assert sum(out.counts) == request.output_tokens
        pure = expected[request.id]
        assert [c for _, c in pure] == out.counts
        ttft = pure[0][0] - request.arrival_s
        assert out.timing["ttft_ns"] / 1e9 == pytest.approx(ttft, rel=0.01)
        live_gaps = [b - a for a, b in itertools.pairwise(out.times_ns)]
        pure_gaps = [b[0] - a[0] for a, b in itertools.pairwise(pure)]
        assert [g / 1e9 for g in live_gaps] == pytest.approx(pure_gaps, rel=0.01, abs=20e-6)


async def _stats(r: Router) -> router_pb2.ServingStats:
    return await r.stub.GetStats(router_pb2.GetStatsRequest(name="small"))


async def test_a_cancelled_stream_frees_its_kv(
    router: Router, small: router_pb2.Deployment
) -> None:
    before = await _stats(router)
    stream = await router.openai.completions.create(
        model="small", prompt="a long answer please", max_tokens=5000, stream=True
    )
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    held = (await _stats(router)).kv_slots_held
    assert held >= 1
    await stream.close()  # the client goes away
    for _ in range(500):
        now = await _stats(router)
        if now.requests_cancelled > before.requests_cancelled and now.requests_in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert now.requests_cancelled == before.requests_cancelled + 1
    assert now.kv_slots_held == 0 and now.kv_slots > 0
    assert now.requests_in_flight == 0


async def test_stats_aggregate_requests(router: Router, small: router_pb2.Deployment) -> None:
    await asyncio.gather(*(_stream(router.openai, f"question {i} " * 100, 10) for i in range(4)))
    stats = await _stats(router)
    assert stats.requests_completed >= 4
    assert stats.ttft.count == stats.requests_completed
    assert 0 < stats.ttft.p50_ns <= stats.ttft.p90_ns <= stats.ttft.p99_ns <= stats.ttft.max_ns
    assert stats.tpot.p50_ns > 0 and stats.output_tokens_per_s > 0
    assert stats.completion_tokens >= 40
    # the same figures on /metrics, as Prometheus scrapes them
    (url,) = supernode_endpoints(router.sn).values()
    families = parse(await scrape(url))
    ttft = families["cmemu_serving_ttft_seconds"]
    count = next(s.value for s in ttft.samples if s.name.endswith("_count"))
    after = await _stats(router)  # requests of other tests may finish meanwhile: bounds
    assert stats.requests_completed <= count <= after.requests_completed
    assert {s.labels["deployment"] for s in ttft.samples} >= {"small"}
    tokens = families["cmemu_serving_completion_tokens"].samples[0].value
    assert stats.completion_tokens <= tokens


async def test_a_repeated_prompt_hits_the_prefix_cache(
    router: Router, small: router_pb2.Deployment
) -> None:
    prompt = [(7 * j) % 5000 + 3 for j in range(3 * 512 + 100)]
    first = await _stream(router.openai, prompt, 4)
    assert first.timing["prefix_hit_tokens"] == 0
    for _ in range(200):  # the blocks are stored off the critical path
        second = await _stream(router.openai, prompt, 4)
        if second.timing["prefix_hit_tokens"]:
            break
    assert second.timing["prefix_hit_tokens"] == 3 * 512
    assert second.timing["ttft_ns"] < first.timing["ttft_ns"]


async def _raw(r: Router, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{r.base_url}{path}", data=body) as response,
    ):
        return response.status, await response.json()


async def test_bad_requests_get_openai_errors(router: Router, small: router_pb2.Deployment) -> None:
    with pytest.raises(openai.NotFoundError):
        await router.openai.completions.create(model="nope", prompt="x", max_tokens=2)
    for bad in (
        {"max_tokens": 0},
        {"max_tokens": "many"},
        {"n": 0},
        {"prompt": [1, 2, 10**9]},
        {"prompt": ""},
        {"stream": "yes"},
    ):
        args: dict[str, Any] = {"model": "small", "prompt": "x", "max_tokens": 2, **bad}
        with pytest.raises(openai.BadRequestError) as err:
            await router.openai.completions.create(**args)
        assert err.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        await router.openai.chat.completions.create(model="small", messages=[])
    status, body = await _raw(router, "/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await _raw(router, "/v1/chat/completions", b"[1]")
    assert status == 400
    status, body = await _raw(router, "/v1/completions", json.dumps({"prompt": "x"}).encode())
    assert status == 400 and body["error"]["param"] == "model"


# --- deployments -------------------------------------------------------------------------------


async def _code(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code().name


async def test_deploy_errors(router: Router, small: router_pb2.Deployment) -> None:
    stub = router.stub
    dup = router_pb2.DeployRequest(name="small", spec_yaml=json.dumps(SMALL))
    assert await _code(stub.Deploy(dup)) == "FAILED_PRECONDITION"
    for bad in (
        router_pb2.DeployRequest(name="x", spec_yaml="- a list"),
        router_pb2.DeployRequest(name="x", spec_yaml="model: gpt-9"),
        router_pb2.DeployRequest(name="Bad Name", model="deepseek-r1", decode_npus=2),
        router_pb2.DeployRequest(name="x", spec_yaml="{}", model="deepseek-r1"),
        router_pb2.DeployRequest(name="x", model="deepseek-r1", options={"decode.npus": "two"}),
        router_pb2.DeployRequest(name="x", spec_yaml=json.dumps({**SMALL, "preset": "cm384"})),
        router_pb2.DeployRequest(
            name="x", spec_yaml=json.dumps({**SMALL, "platform": "cluster-roce"})
        ),
        router_pb2.DeployRequest(  # what-if hardware: model mode only
            name="x", spec_yaml=json.dumps({**SMALL, "hardware": {"npu.ub_ports_per_die": 6}})
        ),
    ):
        assert await _code(stub.Deploy(bad)) in ("INVALID_ARGUMENT", "NOT_FOUND"), bad
    huge = router_pb2.DeployRequest(
        name="huge", model="deepseek-r1", decode_npus=12, prefill_instances=1, prefill_npus=4
    )
    assert await _code(stub.Deploy(huge)) == "RESOURCE_EXHAUSTED"
    listed = await stub.ListDeployments(router_pb2.ListDeploymentsRequest())
    assert [d.name for d in listed.deployments] == ["small"]  # nothing of the refused ones
    assert await _code(stub.GetDeployment(router_pb2.GetDeploymentRequest(name="no"))) == (
        "NOT_FOUND"
    )
    assert await _code(stub.Undeploy(router_pb2.UndeployRequest(name="no"))) == "NOT_FOUND"


async def test_loading_is_503_then_undeploy_releases(
    router: Router, small: router_pb2.Deployment
) -> None:
    stub = router.stub
    request = router_pb2.DeployRequest(
        name="second",
        model="deepseek-r1",
        decode_npus=2,
        prefill_instances=1,
        prefill_npus=2,
        options={"decode.max_batch_per_die": "8", "placement": "eplb"},
    )
    loading = await stub.Deploy(request)
    assert loading.state == router_pb2.DEPLOYMENT_STATE_LOADING
    assert loading.weights.source == "ems"  # cached by the first deployment
    assert loading.instances[0].experts.policy == "eplb"
    with pytest.raises(openai.APIStatusError) as err:
        await router.openai.completions.create(model="second", prompt="x", max_tokens=2)
    assert err.value.status_code == 503
    for _ in range(500):
        got = await stub.GetDeployment(router_pb2.GetDeploymentRequest(name="second"))
        if got.state == router_pb2.DEPLOYMENT_STATE_SERVING:
            break
        await asyncio.sleep(0.02)
    assert got.state == router_pb2.DEPLOYMENT_STATE_SERVING
    out = await router.openai.completions.create(
        model="second", prompt="x", max_tokens=3, extra_body=RUN_TO_MAX
    )
    assert out.usage is not None and out.usage.completion_tokens == 3
    gone = await stub.Undeploy(router_pb2.UndeployRequest(name="second"))
    assert gone.state == router_pb2.DEPLOYMENT_STATE_STOPPED
    jobs = await router.sn.clients.scheduler().ListAllocations(
        scheduler_pb2.ListAllocationsRequest()
    )
    assert not [a.job for a in jobs.allocations if a.job.startswith("second.")]
    with pytest.raises(openai.NotFoundError):
        await router.openai.completions.create(model="second", prompt="x", max_tokens=2)


async def test_request_metrics_are_events() -> None:
    """Each finished request is a `request` event of the router: TTFT, TPOT, queueing."""
    async with running_supernode(
        "cm-mini", time_scale=TIME_SCALE, profile=PROFILE, broker=EMBEDDED
    ) as sn:
        assert sn.broker is not None
        host, port = sn.broker.removeprefix("mqtt://").split(":")
        events: list[dict[str, Any]] = []
        async with aiomqtt.Client(host, int(port)) as mqtt:
            await mqtt.subscribe(f"cmemu/{sn.topology.supernode}/router/events", qos=1)
            request = router_pb2.DeployRequest(
                name="ev", model="deepseek-r1", decode_npus=2, prefill_instances=1,
                prefill_npus=2, options={"decode.max_batch_per_die": "4"}, wait=True,
            )  # fmt: skip
            await sn.clients.router().Deploy(request)
            http = sn.topology.service(ServiceKind.ROUTER).http_address
            async with openai.AsyncOpenAI(
                base_url=f"http://{http}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
            ) as client:
                await asyncio.gather(
                    *(client.completions.create(model="ev", prompt=f"q{i}", max_tokens=3,
                                                extra_body=RUN_TO_MAX)
                      for i in range(2))
                )  # fmt: skip
            async with asyncio.timeout(20):
                async for message in mqtt.messages:
                    assert isinstance(message.payload, bytes)
                    payload = json.loads(message.payload)
                    if payload["event"] == "request":
                        events.append(payload)
                    if len(events) == 2:
                        break
    for e in events:
        assert e["deployment"] == "ev" and e["completion_tokens"] == 3
        assert e["ttft_ns"] > 0 and e["tpot_ns"] > 0 and e["queueing_ns"] >= 0
    assert {e["event"] for e in events} == {"request"}


async def test_with_a_token_the_endpoint_wants_it_as_the_api_key() -> None:
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(server_count(build("cm-mini"))))),
        time_scale=TIME_SCALE,
        profile=PROFILE,
        broker=NO_BROKER,
        drain_s=0.0,
        token="s3cret",
    )
    async with Supernode.start(options) as sn:
        request = router_pb2.DeployRequest(name="t", model="deepseek-r1", decode_npus=2)
        address = sn.topology.service(ServiceKind.ROUTER).address
        async with grpc.aio.insecure_channel(address) as channel:
            anonymous = router_pb2_grpc.RouterStub(channel)
            assert await _code(anonymous.Deploy(request)) == "UNAUTHENTICATED"
        request.wait = True
        request.prefill_instances, request.prefill_npus = 1, 2
        await sn.clients.router().Deploy(request)  # the clients carry the token
        base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0) as bad:
            assert [m.id for m in (await bad.models.list()).data] == ["t"]  # reads are open
            with pytest.raises(openai.AuthenticationError):
                await bad.completions.create(model="t", prompt="x", max_tokens=1)
        async with openai.AsyncOpenAI(base_url=base, api_key="s3cret", max_retries=0) as good:
            done = await good.completions.create(
                model="t", prompt="x", max_tokens=2, extra_body=RUN_TO_MAX
            )
            assert done.usage is not None and done.usage.completion_tokens == 2


async def test_stopping_the_supernode_ends_open_streams() -> None:
    chunks: list[Any] = []
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as sn:
        request = router_pb2.DeployRequest(
            name="s", model="deepseek-r1", decode_npus=2, prefill_instances=1, prefill_npus=2,
            wait=True,
        )  # fmt: skip
        await sn.clients.router().Deploy(request)
        base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}/v1"
        client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
        stream = await client.completions.create(
            model="s",
            prompt="go on",
            max_tokens=60_000,
            stream=True,
            extra_body={"ignore_eos": True},  # still streaming when the supernode stops
        )
        reading = stream.__aiter__()
        chunks.append(await reading.__anext__())
    # the supernode stopped with the stream open: the stream ended (cancelled), nothing hangs
    with contextlib.suppress(openai.APIError, StopAsyncIteration):
        chunks.extend([chunk async for chunk in reading])
    assert chunks[-1].choices[0].finish_reason in (None, "abort")
    await client.close()
