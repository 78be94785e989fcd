"""Hostile HTTP requests for the OpenAI endpoint, shared by its fuzz test (tests/fuzz/test_http.py)
and its soak (bench/http_soak.py): valid requests with one field made hostile (wrong types,
boundary and huge values, deep nesting), corrupt, truncated and oversized bodies, odd methods,
paths and headers. Each case is (method, path, body, headers)."""

from __future__ import annotations

import json
import random
from typing import Any

Case = tuple[str, str, bytes, dict[str, str]]

JSON = {"Content-Type": "application/json"}
HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, -(2**63) - 1, 10**40, 1e308, -0.0, "", "x" * 10_000,
    "\ud800", [], {}, [[[[[]]]]], {"a": {"b": {"c": {}}}}, [None], ["x"] * 200, [2**70],
    [{"type": "image_url"}], [{"type": "text", "text": None}], {"include_usage": "yes"},
]  # fmt: skip
RAW_BODIES: list[bytes] = [
    b"", b"{", b"}", b"null", b"[]", b'"x"', b"1", b"{\"model\": ", b"\xff\xfe\x00",
    b"{\"model\": \"M\", \"prompt\": \"\xff\"}", b"[" * 100_000, b"{\"a\":" * 50_000,
    b"{\"model\": \"M\", \"prompt\": NaN, \"max_tokens\": Infinity}",
    b"{\"model\": \"M\", \"prompt\": \"hi\", \"max_tokens\": 1e400}",
    b"{\"model\": \"M\", \"prompt\": [1, 2, -3]}", b"x" * (2 * 2**20),
]  # fmt: skip
PATHS = ["/", "/v1", "/v1/", "/v1/models/", "/v1/completions/x", "/v1/embeddings", "/%ff",
         "/v1/models/" + "m" * 5000, "/v1/chat/completions?x=" + "y" * 3000]  # fmt: skip
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
MORE_FIELDS = ["n", "stop", "stream", "stream_options", "temperature", "min_tokens", "seed",
               "ignore_eos", "prompt_token_ids", "logprobs"]  # fmt: skip


def valid_bodies(model: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ]


def mutated(rng: random.Random, model: str) -> Case:
    """A valid request with one field made hostile."""
    path, valid = rng.choice(valid_bodies(model))
    body = dict(valid)
    body[rng.choice([*body, *MORE_FIELDS])] = rng.choice(HOSTILE_VALUES)
    return "POST", path, json.dumps(body).encode(), JSON


def fixed(rng: random.Random, model: str) -> list[Case]:
    """Every raw body, odd route and odd header once."""
    cases: list[Case] = []
    paths = ["/v1/completions", "/v1/chat/completions"]
    for raw in RAW_BODIES:
        cases.append(("POST", rng.choice(paths), raw.replace(b'"M"', f'"{model}"'.encode()), {}))
    for path in PATHS:
        cases.append((rng.choice(METHODS), path, b"{}", JSON))
    whole = json.dumps(valid_bodies(model)[0][1]).encode()
    for headers in (
        {"Content-Type": "text/plain", "Authorization": "Basic Zm9vOmJhcg=="},
        {"X-Long": "h" * 8000, "Authorization": "Bearer " + "k" * 4000},
    ):
        cases.append(("POST", "/v1/completions", whole, headers))
    return cases


def cases(rng: random.Random, model: str, mutations: int) -> list[Case]:
    return [mutated(rng, model) for _ in range(mutations)] + fixed(rng, model)


def is_openai_error(status: int, raw: bytes) -> bool:
    """Whether a refusal is OpenAI's error JSON (aiohttp's own plain 400 for a request its
    parser cannot read at all, before any handler, is the one exception)."""
    try:
        error = json.loads(raw)["error"]
        return isinstance(error["message"], str) and len(raw) < 2000
    except (ValueError, KeyError, TypeError):
        return status == 400 and not raw.startswith(b"{")
