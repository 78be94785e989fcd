"""Issue 21 finding 7: with TLS on the gRPC servers, the OpenAI endpoint, /metrics and the web view
were plain HTTP, so the bearer token crossed the wire in clear. They serve HTTPS with the same
certificate now, and a plain-HTTP request to them gets no answer."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import openai
import pytest

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.tenants import single
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.runtime.webview import WebView
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2

TOKEN = "https-token-0123456789abcdef"
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=4.0, cache_from_ems_s=2.0),
)
SPEC = {"model": "deepseek-r1", "decode": {"npus": 2}, "prefill": {"instances": 1, "npus": 2}}


@pytest.fixture(scope="module")
async def tls_sn() -> AsyncIterator[Supernode]:
    async with running_supernode(
        "cm-mini", time_scale=20.0, profile=PROFILE, keys=single(TOKEN), tls="auto"
    ) as sn:
        yield sn


def _trust(sn: Supernode) -> ssl.SSLContext:
    ca = sn.credentials.ca_pem
    assert ca is not None
    return ssl.create_default_context(cadata=ca.decode())


async def _refused_in_clear(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with asyncio.timeout(10), session.get(url.replace("https://", "http://")):
                pass


async def test_the_openai_endpoint_is_https(tls_sn: Supernode) -> None:
    await tls_sn.clients.router().Deploy(
        router_pb2.DeployRequest(name="small", spec_yaml=json.dumps(SPEC), wait=True)
    )
    http = tls_sn.topology.service(ServiceKind.ROUTER).http_address
    client = openai.AsyncOpenAI(
        base_url=f"https://{http}/v1",
        api_key=TOKEN,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=_trust(tls_sn)),
    )
    done = await client.completions.create(model="small", prompt="hi", max_tokens=2)
    assert done.usage is not None and done.usage.prompt_tokens > 0
    await client.close()
    untrusting = openai.AsyncOpenAI(base_url=f"https://{http}/v1", api_key=TOKEN, max_retries=0)
    with pytest.raises(openai.APIConnectionError):  # the system's CAs do not know ours
        await untrusting.models.list()
    await untrusting.close()
    await _refused_in_clear(f"https://{http}/v1/models")


async def test_metrics_are_https(tls_sn: Supernode) -> None:
    (url,) = supernode_endpoints(tls_sn).values()
    assert url.startswith("https://")
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=_trust(tls_sn)) as response,
    ):
        assert response.status == 200
        assert "cmemu_" in await response.text()
    await _refused_in_clear(url)


async def test_the_web_view_is_https(tls_sn: Supernode) -> None:
    context = tls_sn.security.server().ssl_context()
    async with WebView(tls_sn.clients, address="127.0.0.1:0", ssl_context=context) as view:
        assert view.url.startswith("https://")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{view.url}api/snapshot", ssl=_trust(tls_sn)) as response,
        ):
            assert response.status == 200
        await _refused_in_clear(view.url)
