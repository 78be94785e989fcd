"""The fuzz harness for the OpenAI HTTP endpoint (issue 21): schemathesis (PyPI) against the
endpoint's own OpenAPI description, and hostile requests of our own (corrupt, truncated and deeply
nested bodies, wrong types and boundary values in every field of a valid request, odd methods,
paths and headers). The properties: never a 5xx, every refusal OpenAI's error JSON, never a hang
over 10 s, and a normal request answered afterwards.

Schemathesis runs the checks that hold for any input (`not_a_server_error`, status codes, content
types, response schemas and headers, `--max-response-time`). Left out, with the reason: the
positive/negative data checks, since a request valid by the schema can still exceed the model's
context (a 400 no static schema can express) and the endpoint ignores fields it does not use, as
vLLM does.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from bench import hostile_http
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2

HANG_S = 10.0
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=4.0, cache_from_ems_s=2.0),
    # answers of at most 64 tokens: a request without max_tokens (up to the context) that
    # ignores EOS is real work of hours, not a hang; fuzzing needs it to end in seconds
    limits=replace(DEFAULT_PROFILE.limits, http_body_max_bytes=1 * 2**20, max_tokens_max=64),
)
# answers end after 4 tokens by themselves, and emulated time runs fast: a request without
# max_tokens (which may run to the context) still ends in well under a second of wall time
SPEC = {
    "model": "deepseek-r1",
    "decode": {"npus": 2},
    "prefill": {"instances": 1, "npus": 2},
    "output": 4,
}
SCHEMATHESIS = str(Path(sys.executable).parent / "st")
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,response_headers_conformance"
)


@pytest.fixture(scope="module")
async def base() -> AsyncIterator[str]:
    async with running_supernode("cm-mini", time_scale=1000.0, profile=PROFILE) as sn:
        await sn.clients.router().Deploy(
            router_pb2.DeployRequest(name="deepseek-r1", spec_yaml=json.dumps(SPEC), wait=True)
        )
        yield f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}"


@pytest.mark.slow
async def test_schemathesis_finds_nothing(base: str, tmp_path: Path) -> None:
    argv = [
        SCHEMATHESIS, "run", f"{base}/openapi.json", "--checks", CHECKS,
        "--max-response-time", str(HANG_S), "--request-timeout", str(2 * HANG_S),
        "--max-examples", "40", "--seed", "21", "--workers", "2", "--no-shrink",
        "--phases", "coverage,fuzzing,stateful", "--report", "junit",
        "--report-dir", str(tmp_path),
    ]  # fmt: skip
    child = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(300):
        out, _ = await child.communicate()
    text = out.decode(errors="replace")
    # a finding is a failure (a 5xx, a response off its schema) or a network error (a hang);
    # a "Runtime Error" is the tool's own (CPython 3.11.7's ast can raise SystemError inside
    # hypothesis while it describes a strategy), and says nothing of the endpoint
    assert "Failures:" not in text and "Network Error" not in text, text[-6000:]
    assert child.returncode == 0 or "Runtime Error" in text, text[-6000:]
    assert "Tested: 5" in text  # every operation of the description was exercised


# --- hostile requests of our own (bench/hostile_http.py) ----------------------------------------


async def test_hostile_requests_get_openai_errors_never_5xx(base: str) -> None:
    rng = random.Random(2124)
    failures: list[str] = []
    timeout = aiohttp.ClientTimeout(total=HANG_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for method, path, body, headers in hostile_http.cases(rng, "deepseek-r1", 160):
            what = f"{method} {path[:60]} {body[:120]!r}"
            try:
                async with session.request(
                    method, f"{base}{path}", data=body, headers=headers
                ) as response:
                    raw = await response.read()
                    status = response.status
            except TimeoutError:
                failures.append(f"no answer within {HANG_S} s: {what}")
                continue
            if status >= 500:
                failures.append(f"{status}: {what}: {raw[:200]!r}")
            elif status >= 400 and not hostile_http.is_openai_error(status, raw):
                failures.append(f"{status} not OpenAI's error JSON: {what}: {raw[:200]!r}")
        path, valid = hostile_http.valid_bodies("deepseek-r1")[0]
        async with session.post(f"{base}{path}", json=valid) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["usage"]["prompt_tokens"] > 0
    assert not failures, "\n".join(failures[:20])
