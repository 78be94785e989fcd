"""Request bodies into what the engine runs: prompts as the model's token ids, how many answers,
their lengths, and whether to stream. Every bad field is a 400 naming it (413 for a prompt beyond
`limits.prompt_bytes_max`), checked before any tokenizing; the context limit (prompt plus
`max_tokens` within the model's `context_tokens`) is OpenAI's and vLLM's 400
`context_length_exceeded`.

Accepted as vLLM accepts them: a prompt as text, token ids, or a list of either (one choice per
prompt and `n`; `prompt_token_ids` as well), `n`, `stop`, `ignore_eos`, `min_tokens`, `seed`;
sampling parameters (`temperature`, `top_p`, `top_k`, penalties) are range-checked and recorded
(services/serving/endpoint/outputs.py says why they change nothing). Unknown fields are ignored,
as vLLM ignores them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.emulator.model.errors import quote
from cmemu.services.serving.endpoint.errors import bad, too_large
from cmemu.services.serving.endpoint.limits import utf8_len
from cmemu.services.serving.endpoint.outputs import Lengths
from cmemu.services.serving.tokenizer import Tokenizer

THREAD_BYTES = 16 * 1024  # text longer than this is tokenized off the event loop
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ROLES |= {"tool": "tool", "function": "tool"}
# name: (lowest, highest) of the sampling parameters recorded
SAMPLING: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (-1.0, math.inf),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.0, math.inf),
}


@dataclass(frozen=True, kw_only=True)
class Ask:
    """A parsed request, before its lengths are fitted to the model's context."""

    model: str
    prompts: tuple[tuple[int, ...], ...]
    n: int
    max_tokens: int | None  # None: up to the context (the draw decides)
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    seed: int | None
    sampling: dict[str, float] = field(default_factory=dict)  # recorded, no effect

    def lengths(self, context_tokens: int, max_tokens_max: int) -> Lengths:
        """The answers' lengths within `context_tokens` (and `max_tokens_max` output tokens);
        400 when a prompt and `max_tokens` do not fit (vLLM's message and OpenAI's code)."""
        if self.max_tokens is not None and self.max_tokens > max_tokens_max:
            raise bad(f"max_tokens is at most {max_tokens_max:,}", "max_tokens")
        longest = max(len(p) for p in self.prompts)
        room = context_tokens - longest
        if room < 1 or (self.max_tokens is not None and self.max_tokens > room):
            asked = self.max_tokens if self.max_tokens is not None else 1
            raise bad(
                f"This model's maximum context length is {context_tokens} tokens. However, you "
                f"requested {longest + asked} tokens ({longest} in the messages, {asked} in the "
                "completion). Please reduce the length of the messages or completion.",
                "messages" if self.max_tokens is None else "max_tokens",
                code="context_length_exceeded",
            )
        max_tokens = min(room, max_tokens_max) if self.max_tokens is None else self.max_tokens
        if self.min_tokens > max_tokens:
            raise bad(f"min_tokens ({self.min_tokens}) exceeds max_tokens", "min_tokens")
        return Lengths(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop=self.stop,
        )


@dataclass(frozen=True, kw_only=True)
class Parser:
    tokenizer: Tokenizer
    limits: EmulatorLimits
    vocab: int

    async def completion(self, body: Mapping[str, Any]) -> Ask:
        if "prompt_token_ids" in body and body.get("prompt") is None:
            prompts = self._ids(body["prompt_token_ids"], "prompt_token_ids")
        elif "prompt" in body:
            prompts = await self._prompts(body["prompt"])
        else:
            raise bad("prompt is required", "prompt")
        if _flag(body, "echo"):
            raise bad("echo is not supported (the emulator has no prompt logprobs)", "echo")
        if body.get("logprobs") not in (None, 0, False):
            raise bad("logprobs are not supported (the emulated text has none)", "logprobs")
        return self._ask(body, prompts, "max_tokens")

    async def chat(self, body: Mapping[str, Any]) -> Ask:
        messages = self._messages(body.get("messages"))
        if _flag(body, "logprobs"):
            raise bad("logprobs are not supported (the emulated text has none)", "logprobs")
        try:
            ids = await self._tokenize(self.tokenizer.chat, messages, _text_bytes(messages))
        except (TypeError, ValueError, LookupError) as exc:  # what the template could not take
            raise bad(
                f"the messages do not fit the model's chat template: {exc}", "messages"
            ) from exc
        return self._ask(body, (tuple(ids),), "max_completion_tokens")

    # --- prompts ---------------------------------------------------------------------------

    async def _prompts(self, prompt: Any) -> tuple[tuple[int, ...], ...]:
        """Text, ids, or a list of texts or of id lists."""
        if isinstance(prompt, str):
            return (await self._text(prompt),)
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            self._choices(len(prompt), "prompt")
            size = sum(utf8_len(p) for p in prompt)
            self._bytes(size, "prompt")
            return tuple([await self._text(p) for p in prompt])
        return self._ids(prompt, "prompt")

    def _ids(self, value: Any, param: str) -> tuple[tuple[int, ...], ...]:
        if isinstance(value, list) and value and all(_is_int(t) for t in value):
            value = [value]
        if not (isinstance(value, list) and value and all(isinstance(p, list) for p in value)):
            raise bad(
                f"{param} must be a string, a list of strings, token ids or a list of token "
                "id lists",
                param,
            )
        self._choices(len(value), param)
        total = sum(len(p) for p in value)
        if total > self.limits.prompt_bytes_max // 2:  # ids are at least two bytes of JSON
            raise too_large(f"{param} holds {total:,} token ids", param)
        out = []
        for p in value:
            if not all(_is_int(t) and 0 <= t < self.vocab for t in p):
                raise bad(f"{param}: token ids must be integers 0..{self.vocab - 1}", param)
            if not p:
                raise bad("the prompt is empty", param)
            out.append(tuple(p))
        return tuple(out)

    async def _text(self, text: str) -> tuple[int, ...]:
        ids = await self._tokenize(self.tokenizer.encode, text, utf8_len(text))
        if not ids:
            raise bad("the prompt is empty", "prompt")
        return tuple(ids)

    async def _tokenize(
        self, encode: Callable[[Any], list[int]], value: Any, size: int
    ) -> list[int]:
        self._bytes(size, "prompt")
        if size > THREAD_BYTES:  # the tokenizer releases the GIL: the loop goes on meanwhile
            return await asyncio.to_thread(encode, value)
        return encode(value)

    def _bytes(self, size: int, param: str) -> None:
        cap = self.limits.prompt_bytes_max
        if size > cap:
            raise too_large(f"the prompt is {size:,} bytes; the limit is {cap:,}", param)

    def _choices(self, count: int, param: str) -> None:
        cap = self.limits.choices_max
        if count > cap:
            raise bad(f"{count} prompts: at most {cap} choices per request", param)

    # --- chat messages ---------------------------------------------------------------------

    def _messages(self, raw: Any) -> list[dict[str, Any]]:
        if not isinstance(raw, list) or not raw:
            raise bad("messages must be a non-empty list", "messages")
        if len(raw) > self.limits.messages_max:
            raise bad(f"{len(raw)} messages; the limit is {self.limits.messages_max}", "messages")
        parts = 0
        out = []
        for i, message in enumerate(raw):
            where = f"messages[{i}]"
            if not isinstance(message, dict):
                raise bad(f"{where} must be an object", "messages")
            role = message.get("role")
            if not isinstance(role, str) or role not in ROLES:
                raise bad(
                    f"{where}.role must be one of {sorted(ROLES)}, got {quote(role, 40)}",
                    "messages",
                )
            content, used = _content(message.get("content"), where)
            parts += used
            if parts > self.limits.content_parts_max:
                raise bad(f"more than {self.limits.content_parts_max} content parts", "messages")
            rendered: dict[str, Any] = {"role": ROLES[role], "content": content}
            calls = message.get("tool_calls")
            if role == "assistant" and calls:
                rendered["tool_calls"] = _tool_calls(calls, where)
                rendered["content"] = message.get("content") and content
            out.append(rendered)
        return out

    # --- the rest of the body ----------------------------------------------------------------

    def _ask(self, body: Mapping[str, Any], prompts: Sequence[tuple[int, ...]], key: str) -> Ask:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise bad("model is required (a deployment's name: GET /v1/models)", "model")
        max_tokens = _int(body, key, None)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", None)
        if max_tokens is not None and max_tokens < 1:
            raise bad(f"{key} must be >= 1", key)
        n = _int(body, "n", 1)
        assert n is not None
        if n < 1:
            raise bad("n must be >= 1", "n")
        self._choices(n * len(prompts), "n")
        min_tokens = _int(body, "min_tokens", 0)
        assert min_tokens is not None
        if min_tokens < 0:
            raise bad("min_tokens must be >= 0", "min_tokens")
        stream = _flag(body, "stream")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise bad("stream_options must be an object", "stream_options")
        options = options or {}
        if options and not stream:
            raise bad("stream_options is only allowed with stream=true", "stream_options")
        include = options.get("include_usage", False)
        if not isinstance(include, bool):
            raise bad("stream_options.include_usage must be a boolean", "stream_options")
        seed = _int(body, "seed", None)
        return Ask(
            model=model,
            prompts=tuple(prompts),
            n=n,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=_flag(body, "ignore_eos"),
            stop=self._stop(body.get("stop")),
            stream=stream,
            include_usage=include,
            seed=seed,
            sampling=_sampling(body),
        )

    def _stop(self, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad("stop must be a non-empty string or a list of them", "stop")
        if len(stops) > self.limits.stop_max:
            raise bad(f"at most {self.limits.stop_max} stop sequences", "stop")
        if any(len(s) > self.limits.stop_chars_max for s in stops):
            raise bad(f"a stop sequence is at most {self.limits.stop_chars_max} characters", "stop")
        return tuple(stops)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if not _is_int(value):
        raise bad(f"{key} must be an integer", key)
    if not -(2**63) <= value < 2**63:
        raise bad(f"{key} is out of range", key)
    return int(value)


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{key} must be a boolean", key)
    return value


def _sampling(body: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, (low, high) in SAMPLING.items():
        value = body.get(key)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not low <= value <= high:
            raise bad(f"{key} must be a number in [{low:g}, {high:g}]", key)
        out[key] = float(value)
    return out


def _content(content: Any, where: str) -> tuple[str, int]:
    """A message's text and how many content parts it had."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 1
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad(f"{where}: only text content parts are supported", "messages")
            text = part.get("text")
            if not isinstance(text, str):
                raise bad(f"{where}: a text part needs text", "messages")
            texts.append(text)
        return "".join(texts), len(content)
    raise bad(f"{where}.content must be a string or a list of parts", "messages")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls must be a list", "messages")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        ok = isinstance(function, dict) and all(
            isinstance(function.get(k), str) for k in ("name", "arguments")
        )
        if not ok:
            raise bad(f"{where}.tool_calls: each needs function.name and arguments", "messages")
        assert isinstance(function, dict)
        out.append({"type": "function", "function": dict(function)})
    return out


def _text_bytes(messages: Sequence[Mapping[str, Any]]) -> int:
    total = 0
    for m in messages:
        total += utf8_len(m.get("content") or "")
        for call in m.get("tool_calls", ()):
            total += utf8_len(call["function"]["name"]) + utf8_len(call["function"]["arguments"])
    return total
