"""Live dynamic PD (issue 24 item 4) on an in-process cm-mini, over real gRPC and HTTP: three
instances of 2 NPUs (two prefill, one decode) under `pd: dynamic`. A decode-heavy phase (short
prompts, long answers) moves one instance to decode; a prefill-heavy phase (long prompts, short
answers) moves it back. Each switch drains, reloads the weights from EMS (2 s at this profile)
and joins, in emulated time, with `pd-switch` and `pd-joined` events. The must-fail twin: under
`fixed` the same decode-heavy phase switches nothing. A bad `pd` is INVALID_ARGUMENT.

The profile gives a die 512 GiB of HBM: DeepSeek-R1's weights over the 4 dies of a 2-NPU unit
(222 GB a die) must fit for the cost model to rate a decode unit, and cm-mini has 16 NPUs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import aiomqtt
import grpc
import pytest

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import EMBEDDED, Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2
from tests.runtime.test_metrics import parse, scrape
from tests.services.test_serving_recovery import router_events

pytestmark = pytest.mark.slow

PROFILE = replace(
    DEFAULT_PROFILE,
    npu=replace(DEFAULT_PROFILE.npu, hbm_bytes_per_die=512 * 2**30),
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=4.0, cache_from_ems_s=2.0),
)
LOAD_S = PROFILE.serving.cache_from_ems_s
TIME_SCALE = 50.0
PD = {"interval_s": 4, "window_s": 12, "horizon_s": 120, "headroom": 0.2}
SPEC: dict[str, Any] = {
    "model": "deepseek-r1",
    "decode": {"instances": 1, "npus": 2, "max_batch_per_die": 4},
    "prefill": {"instances": 2, "npus": 2},
}
DECODE_HEAVY = (64, 300, 8, 1.0)  # prompt tokens, output tokens, requests, emulated s apart
PREFILL_HEAVY = (8000, 4, 24, 0.5)
WAIT_EMULATED_S = 300.0


@pytest.fixture(scope="module")
async def sn() -> AsyncIterator[Supernode]:
    async with running_supernode(
        "cm-mini", time_scale=TIME_SCALE, profile=PROFILE, broker=EMBEDDED
    ) as supernode:
        yield supernode


async def _deploy(sn: Supernode, name: str, pd: dict[str, Any]) -> router_pb2.Deployment:
    spec = {**SPEC, "pd": pd}
    return await sn.clients.router().Deploy(
        router_pb2.DeployRequest(name=name, spec_yaml=json.dumps(spec), wait=True)
    )


async def _get(sn: Supernode, name: str) -> router_pb2.Deployment:
    return await sn.clients.router().GetDeployment(router_pb2.GetDeploymentRequest(name=name))


async def _until(sn: Supernode, probe: Callable[[], Any], check: Callable[[Any], bool]) -> Any:
    """Poll `probe` until `check` holds, within an emulated deadline."""
    assert sn.time is not None
    clock = sn.time.clock
    deadline = clock.now_ns() + WAIT_EMULATED_S * 1e9
    while True:
        value = await probe()
        if check(value):
            return value
        assert clock.now_ns() < deadline, f"not within {WAIT_EMULATED_S} emulated s: {value}"
        await asyncio.sleep(0.05)


async def _phase(sn: Supernode, name: str, mix: tuple[int, int, int, float]) -> list[int]:
    """`count` completions of `prompt` tokens and `output` tokens each, `gap` emulated seconds
    apart (on the supernode's clock); every one must finish. Their completion tokens."""
    prompt, output, count, gap = mix
    assert sn.time is not None
    base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}"

    async def one(session: aiohttp.ClientSession, i: int) -> int:
        body = {
            "model": name,
            "prompt": [(13 * i + j) % 9000 + 5 for j in range(prompt)],
            "max_tokens": output,
            "ignore_eos": True,
        }
        async with session.post(f"{base}/v1/completions", json=body) as response:
            doc = await response.json()
            assert response.status == 200, doc
            return int(doc["usage"]["completion_tokens"])

    async with aiohttp.ClientSession() as session:
        sent = []
        for i in range(count):
            sent.append(asyncio.create_task(one(session, i)))
            await Timeline(sn.time.clock).sleep(gap)
        return list(await asyncio.gather(*sent))


def _split(d: router_pb2.Deployment) -> tuple[int, int, int]:
    return d.pd.prefill_units, d.pd.decode_units, d.pd.switching_units


async def test_the_split_follows_a_shifting_mix(sn: Supernode) -> None:
    events: list[dict[str, Any]] = []
    ready = asyncio.Event()
    listening = asyncio.create_task(router_events(sn, events, ready, ("pd-switch", "pd-joined")))
    await ready.wait()
    try:
        d = await _deploy(sn, "shifting", {"policy": "dynamic", **PD})
        assert d.pd.policy == "dynamic" and _split(d) == (2, 1, 0) and not d.pd.switches

        # decode-heavy: one prefill instance goes to decode
        started = sn.time.clock.now_ns() if sn.time else 0
        assert await _phase(sn, "shifting", DECODE_HEAVY) == [DECODE_HEAVY[1]] * DECODE_HEAVY[2]
        d = await _until(sn, lambda: _get(sn, "shifting"), lambda x: _split(x) == (1, 2, 0))
        (first,) = d.pd.switches
        assert first.to == "decode" and len(first.instances) == 1
        assert started < first.at_ns and first.joined_ns - first.at_ns >= LOAD_S * 1e9
        moved = first.instances[0]
        assert moved.startswith("prefill-")  # it keeps its name; its role says what it does
        assert {i.id: i.role for i in d.instances}[moved] == "decode"

        # prefill-heavy: it (or another decode instance) goes back to prefill
        tokens = await _phase(sn, "shifting", PREFILL_HEAVY)
        assert tokens == [PREFILL_HEAVY[1]] * PREFILL_HEAVY[2]
        d = await _until(sn, lambda: _get(sn, "shifting"), lambda x: len(x.pd.switches) >= 2)
        d = await _until(sn, lambda: _get(sn, "shifting"), lambda x: _split(x) == (2, 1, 0))
        second = d.pd.switches[1]
        assert second.to == "prefill" and second.at_ns > first.joined_ns
        assert second.joined_ns - second.at_ns >= LOAD_S * 1e9

        # the same switches as events, at the same emulated instants
        await _until(sn, lambda: asyncio.sleep(0, events), lambda e: len(e) >= 4)
        switch = [e for e in events if e["event"] == "pd-switch"]
        joined = [e for e in events if e["event"] == "pd-joined"]
        assert [e["direction"] for e in switch[:2]] == ["prefill->decode", "decode->prefill"]
        assert [e["emulated_ns"] for e in switch[:2]] == [first.at_ns, second.at_ns]
        assert [e["units"] for e in switch[:2]] == [1, 1]
        assert switch[0]["prefill_share"] < 0.5 < switch[1]["prefill_share"]  # the mix measured
        assert joined[0]["instance"] == moved and joined[0]["role"] == "decode"
        assert joined[0]["emulated_ns"] == first.joined_ns

        # units per role on /metrics
        (url,) = supernode_endpoints(sn).values()
        units = parse(await scrape(url))["cmemu_serving_pd_units"]
        mine = {
            s.labels["role"]: s.value for s in units.samples if s.labels["deployment"] == "shifting"
        }
        assert mine == {"prefill": 2.0, "decode": 1.0, "switching": 0.0}
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await listening
        with contextlib.suppress(grpc.aio.AioRpcError):
            await sn.clients.router().Undeploy(router_pb2.UndeployRequest(name="shifting"))


async def test_fixed_switches_nothing_under_the_same_mix(sn: Supernode) -> None:
    d = await _deploy(sn, "fixed", {"policy": "fixed", **PD})
    try:
        roles = {i.id: i.role for i in d.instances}
        assert not d.HasField("pd")  # nothing runs: the deployment serves as deployed
        assert await _phase(sn, "fixed", DECODE_HEAVY) == [DECODE_HEAVY[1]] * DECODE_HEAVY[2]
        assert sn.time is not None
        await Timeline(sn.time.clock).sleep(
            3 * PD["interval_s"]
        )  # decisions the dynamic policy would make
        d = await _get(sn, "fixed")
        assert {i.id: i.role for i in d.instances} == roles
        assert not d.HasField("pd")
    finally:
        await sn.clients.router().Undeploy(router_pb2.UndeployRequest(name="fixed"))


@pytest.mark.parametrize(
    ("pd", "spec", "message"),
    [
        ("random", {}, "unknown pd.policy 'random'; known: dynamic, fixed"),
        ({"policy": "dynamic", "window_s": 0}, {}, "pd.window_s must be > 0"),
        ({"policy": "dynamic", "headroom": -1}, {}, "pd.headroom must be >= 0"),
        ({"policy": "dynamic", "every": 3}, {}, "pd: unknown fields ['every']"),
        ("dynamic", {"decode": {"npus": 4}}, "decode.npus (4) must equal prefill.npus (2)"),
    ],
)
async def test_a_bad_pd_is_invalid_argument(
    sn: Supernode, pd: Any, spec: dict[str, Any], message: str
) -> None:
    doc = {**SPEC, **spec, "pd": pd}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(name="bad", spec_yaml=json.dumps(doc), wait=True)
        )
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.value.details() or "")
