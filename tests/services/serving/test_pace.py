"""Issue 24: when the endpoint falls behind the wall clock, tokens leave late and together; each
response says so (`lag_ms` per chunk, `first_token_lag_ms`, `max_lag_ms`, `kept_pace` at the end)
so a client can read its own TTFT against the emulated one. The wall clock is injected: one reply
released on time, one released 2 s late."""

from __future__ import annotations

import json

from cmemu.emulator.engines.serving.stats import RequestMetrics
from cmemu.emulator.engines.serving.streams import Stream
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.serving.engine import FinishEvent, FinishReason, Request, TokenEvent
from cmemu.services.serving.endpoint.asks import Ask
from cmemu.services.serving.endpoint.outputs import Choice
from cmemu.services.serving.endpoint.responses import COMPLETIONS, Answer, Reply
from cmemu.services.serving.tokenizer import load_tokenizer

TOLERANCE_S = 0.05


def _reply(late_s: float) -> Reply:
    """A reply of 3 tokens at emulated 1.0, 1.1, 1.2 s (time scale 1, epoch 0), read when the
    wall clock is `late_s` past each token's instant."""
    request = Request(id="r", arrival_s=0.5, input_tokens=4, output_tokens=3)
    stream = Stream(
        request=request,
        tokens=(1, 2, 3, 4),
        metrics=RequestMetrics(request_id="r", arrival_ns=500_000_000, prompt_tokens=4),
    )
    events = [TokenEvent(request_id="r", time_s=1.0 + 0.1 * i, index=i, count=1) for i in range(3)]
    for event in events:
        stream.events.put_nowait(event)
    stream.events.put_nowait(
        FinishEvent(request_id="r", time_s=1.2, reason=FinishReason.LENGTH, tokens=3)
    )
    # the wall clock read as each token goes out: `late_s` past the token's emulated instant
    ticks = iter([e.time_s + late_s for e in events])
    clock = Clock(time_scale=1.0, epoch_wall_s=0.0, wall=lambda: next(ticks))
    ask = Ask(
        model="m", prompts=((1, 2, 3, 4),), n=1, max_tokens=3, min_tokens=0, ignore_eos=True,
        stop=(), stream=False, include_usage=False, seed=None,
    )  # fmt: skip
    choice = Choice(index=0, prompt=0, seed=1, tokens=3, finish="length")
    return Reply(
        ask=ask,
        shape=COMPLETIONS,
        answers=[Answer(choice=choice, stream=stream)],
        tokenizer=load_tokenizer().tokenizer,
        clock=clock,
        lag_tolerance_s=TOLERANCE_S,
    )


async def _timing(late_s: float) -> dict[str, object]:
    response = await _reply(late_s).whole()
    assert response.body is not None
    body = json.loads(bytes(response.body))  # type: ignore[arg-type]
    timing: dict[str, object] = body["cmemu"]
    return timing


async def test_on_time_keeps_pace() -> None:
    timing = await _timing(0.0)
    assert timing["kept_pace"] is True
    assert timing["first_token_lag_ms"] == 0.0 and timing["max_lag_ms"] == 0.0


async def test_late_release_is_reported() -> None:
    timing = await _timing(2.0)
    assert timing["kept_pace"] is False
    assert timing["first_token_lag_ms"] == 2000.0 and timing["max_lag_ms"] == 2000.0
