"""How long each emulated answer is and what text it carries, decided when the request arrives.

A real model stops at its end-of-sequence token, at a stop sequence, or at `max_tokens`. Here:
- the natural length is a draw from the deployment's output-length model (`output` in the
  deployment), raised to `min_tokens`; `ignore_eos` (the benchmark tools' way of fixing output
  lengths) skips it, so the answer runs to `max_tokens`;
- the text is one vocabulary word per token (services/serving/tokenizer.py), so a `stop` string
  can occur in it: the answer then ends at the token that completes the first occurrence, its
  text cut before the stop string (OpenAI's rule), `finish_reason` "stop";
- `seed` makes the draw and the text repeatable; without it each request draws anew.
Sampling parameters (`temperature`, `top_p`, penalties) are recorded and change nothing: the
emulator serves timing, not language. Whatever the length, the engine is told it up front, so its
timing is that of a request of exactly that many output tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cmemu.emulator.model.serving.lengths import Distribution, sample
from cmemu.services.serving.tokenizer import Tokenizer, output_words

SEED_SPACE = 2**31


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One answer (one engine request) of a response."""

    index: int  # its index among the response's choices
    prompt: int  # which prompt it answers
    seed: int  # picks its words
    tokens: int  # output tokens the engine generates
    finish: str  # "length" or "stop", once every token is out
    cut: int | None = None  # characters of text kept (a stop string), None: all


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """What a request asked about its answers' lengths."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()


def plan(
    *,
    index: int,
    prompt: int,
    lengths: Lengths,
    natural: Distribution,
    rng: np.random.Generator,
    tokenizer: Tokenizer,
) -> Choice:
    """One choice's length, finish reason and text cut."""
    seed = int(rng.integers(SEED_SPACE))
    if lengths.ignore_eos:
        tokens, finish = lengths.max_tokens, "length"
    else:
        drawn = max(sample(natural, rng), lengths.min_tokens, 1)
        tokens = min(drawn, lengths.max_tokens)
        finish = "stop" if drawn < lengths.max_tokens else "length"
    hit = _first_stop(tokenizer, seed, tokens, lengths.stop, lengths.min_tokens)
    if hit is not None:
        tokens, cut = hit
        return Choice(index=index, prompt=prompt, seed=seed, tokens=tokens, finish="stop", cut=cut)
    return Choice(index=index, prompt=prompt, seed=seed, tokens=tokens, finish=finish)


def _first_stop(
    tokenizer: Tokenizer, seed: int, tokens: int, stops: Sequence[str], min_tokens: int
) -> tuple[int, int] | None:
    """(tokens up to and including the one completing the first stop string that ends at or
    after `min_tokens`, characters before it), or None. The words repeat with the vocabulary's
    period, so looking one period plus a stop string's length past `min_tokens` finds any."""
    if not stops:
        return None
    period = len(tokenizer.words())
    ahead = min(tokens, max(min_tokens, 1) + period + max(len(s) for s in stops) + 1)
    words = output_words(tokenizer, seed, 0, ahead)
    text = "".join(words)
    ends = np.cumsum([len(w) for w in words])
    best: tuple[int, int] | None = None
    for stop in stops:
        at = text.find(stop)
        while at >= 0:
            token = int(np.searchsorted(ends, at + len(stop)))  # the word completing it
            if token + 1 >= min_tokens:  # min_tokens holds a stop back (vLLM's rule)
                if best is None or (token + 1, at) < best:
                    best = (token + 1, at)
                break
            at = text.find(stop, at + 1)
    return best


def text(tokenizer: Tokenizer, choice: Choice, index: int, count: int, sent: int) -> str:
    """The text of `count` tokens from token `index`, `sent` characters having gone out before
    (a stop string cuts it)."""
    piece = "".join(output_words(tokenizer, choice.seed, index, count))
    if choice.cut is None:
        return piece
    return piece[: max(0, choice.cut - sent)]
