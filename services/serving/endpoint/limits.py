"""What a request body may be (issue 21): the limits are figures of the hardware profile
(`limits.http_*`, `json_depth_max`, `prompt_bytes_max`, ...), checked here before anything of the
request reaches the tokenizer, the engine or EMS. Too big is 413, malformed is 400, both naming
the limit."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.services.serving.endpoint.errors import bad, too_large


async def read_json(request: web.Request, limits: EmulatorLimits) -> dict[str, Any]:
    """The body as a JSON object: 413 beyond `http_body_max_bytes`, 400 when it is not JSON, not
    an object, or nested deeper than `json_depth_max`."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large(
            f"the body is larger than {limits.http_body_max_bytes:,} bytes (the endpoint's limit)"
        ) from exc
    try:
        body = json.loads(raw)
    except RecursionError as exc:  # the C scanner's own guard: far past our depth
        raise bad(f"the body nests deeper than {limits.json_depth_max} levels") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    if depth(body) > limits.json_depth_max:
        raise bad(f"the body nests deeper than {limits.json_depth_max} levels")
    return body


def depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in children if isinstance(child, dict | list))
    return deepest


def utf8_len(text: str) -> int:
    """UTF-8 bytes of `text`, without encoding it when the answer is plain; 400 for text that
    is not Unicode (a lone surrogate, which JSON's \\ud800 escapes can carry)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise bad(f"the text is not valid Unicode: {exc.reason} at {exc.start}") from exc
