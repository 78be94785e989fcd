"""Token ids for prompts given as lengths: a Mooncake trace's `hash_ids`.

Text is tokenized by the model's tokenizer (services/serving/tokenizer.py). A trace carries no
text, only lengths and prefix-block hashes; what matters then is that equal prefixes give equal
ids, so that EMS prefix keys (a hash chain over token blocks) hit exactly when a real system's
would: each `hash_id` names one block of the trace's block size in context, so block `h` becomes
the same `block` ids wherever it appears.
"""

from __future__ import annotations

from collections.abc import Sequence

from cmemu.emulator.model.errors import InvalidArgumentError

VOCAB = 129_280  # DeepSeek-V3/R1's vocabulary (the model card): every id is below it

__all__ = ["VOCAB", "block_tokens"]


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
