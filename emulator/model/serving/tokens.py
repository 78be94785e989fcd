"""Synthetic tokens: deterministic ids for prompts, synthetic text for outputs.

No tokenizer runs here (the emulator serves timing, not language). What matters is that equal
prefixes give equal ids, so that EMS prefix keys (a hash chain over token blocks) hit exactly
when a real system's would:
- text: one token per TEXT_CHARS characters, its id a hash of those characters;
- a Mooncake trace: each `hash_id` names one block of the trace's block size in context, so block
  `h` becomes the same `block_tokens` ids wherever it appears.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from emulator.model.errors import InvalidArgumentError

VOCAB = 129_280  # DeepSeek-V3/R1's vocabulary (the model card): ids are below it
TEXT_CHARS = 4  # the usual rule of thumb for English BPE: about four characters a token
WORDS = (
    "the", "emulated", "supernode", "serves", "tokens", "at", "the", "pace", "of", "its",
    "cost", "model", "while", "experts", "route", "over", "unified", "bus", "links", "and",
    "prefix", "blocks", "return", "from", "pooled", "memory", "so", "decode", "never", "waits",
)  # fmt: skip


def text_tokens(text: str) -> list[int]:
    """One id per TEXT_CHARS characters (at least one for any text)."""
    if not text:
        return []
    return [
        zlib.crc32(text[i : i + TEXT_CHARS].encode()) % VOCAB
        for i in range(0, len(text), TEXT_CHARS)
    ]


def block_tokens(hash_ids: Sequence[int], input_length: int, block: int) -> list[int]:
    """A Mooncake trace's prompt as ids: block i is `block` ids derived from hash_ids[i], cut to
    `input_length` (the last block may be partial; missing blocks are refused)."""
    if input_length < 0 or block <= 0:
        raise InvalidArgumentError("input_length must be >= 0 and the block size > 0")
    if len(hash_ids) * block < input_length:
        raise InvalidArgumentError(
            f"{len(hash_ids)} blocks of {block} tokens cannot hold {input_length} tokens",
            field="hash_ids",
        )
    ids: list[int] = []
    for h in hash_ids:
        if len(ids) >= input_length:
            break
        seed = (h * 2_654_435_761 + 0x9E3779B9) & 0xFFFFFFFF
        ids.extend((seed + j * 40_503) % VOCAB for j in range(block))
    return ids[:input_length]


def output_text(seed: int, index: int, count: int) -> str:
    """The synthetic text of `count` output tokens from token `index` of a request."""
    return "".join(f" {WORDS[(seed * 31 + i) % len(WORDS)]}" for i in range(index, index + count))
