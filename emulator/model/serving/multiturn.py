"""What EMS context caching does for the later turns of conversations, predicted from the
structure (calibrate.py's multi-turn point): no published figure to compare with, so it checks
direction and size, never a fit.

A later turn is a request whose leading prompt blocks an earlier request already had (the
Mooncake trace keeps multi-turn order: a turn's `hash_ids` start with the conversation so far).
Each is timed alone on an idle prefill instance of the published layout (EP32, two microbatches,
the default placement), as the engine times a batch of one (starting.py, completing.py):

- without EMS: the whole prompt is prefilled;
- with EMS: one MatchPrefix lookup, then the matched blocks are read from the memory pool into
  HBM (cost.prefix_load_s: one UB read per block, pipelined layer by layer with the forward
  pass) and only the suffix is prefilled, attending over the whole context.

The pool holds every earlier block (EMS's DRAM share of the pools is terabytes against the
trace's gigabytes) and the prefill instance's HBM holds none of them, so the loads are all paid:
the gain is the lower bound of what EMS gives these turns, and queueing (the trace's load) is left
out: it multiplies whatever the prefill saves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.experts import imbalance
from cmemu.emulator.model.serving.models import ModelShape

Moe = Callable[[int, int], tuple[float, float]]  # (ranks, tokens per rank) -> (dispatch, combine)


@dataclass(frozen=True, kw_only=True)
class TurnGain:
    later_turns: int  # requests that found an earlier request's leading blocks
    cached_share: float  # of those requests' prompt tokens, the share cached before them
    ttft_p50_without_s: float
    ttft_p50_with_s: float

    @property
    def gain(self) -> float:
        """How many times shorter the later turns' median TTFT is with EMS."""
        return self.ttft_p50_without_s / self.ttft_p50_with_s


def later_turns(requests: Sequence[Request], block_tokens: int) -> list[tuple[Request, int]]:
    """Each request (in arrival order) with the leading blocks an earlier request had, those
    that had any."""
    seen: set[str] = set()
    out: list[tuple[Request, int]] = []
    for r in sorted(requests, key=lambda r: r.arrival_s):
        matched = 0
        for key in r.block_keys:
            if key not in seen:
                break
            matched += 1
        # a prompt entirely cached still prefills its last token (the first output's logits)
        matched = min(matched, (r.input_tokens - 1) // block_tokens)
        if matched:
            out.append((r, matched))
        seen.update(r.block_keys)
    return out


def idle_ttft_s(
    model: ModelShape,
    moe: Moe,
    *,
    prompt_tokens: int,
    cached_blocks: int,
    profile: HardwareProfile,
) -> float:
    """One request's prefill alone on an idle EP32 instance, `cached_blocks` of its prompt read
    from EMS (0: no caching, no lookup)."""
    s = profile.serving
    dies = ep = s.prefill_ep
    block = s.block_tokens
    prefix = cached_blocks * block
    new = prompt_tokens - prefix
    if new < 1:
        raise InvalidArgumentError(
            f"{cached_blocks} cached blocks leave nothing of a {prompt_tokens}-token prompt",
            field="cached_blocks",
        )
    micro = 2
    per_die = math.ceil(new / dies)
    dispatch, combine = moe(
        ep,
        cost.prefill_tokens_per_rank(tokens_per_die=per_die, microbatches=micro, dies=dies, ep=ep),
    )
    block_bytes = cost.kv_bytes_per_token(model, profile) * block
    load = cost.prefix_load_s(cached_blocks, block_bytes, ub_across_servers=True, profile=profile)
    step = cost.prefill_batch(
        model,
        tokens_per_die=new / dies,
        attention_pairs_per_die=new * (prefix + (new + 1) / 2) / dies,
        requests_per_die=1 / dies,
        load_s=load,
        microbatches=micro,
        imbalance=imbalance(model, ep, "static", profile),
        dies=dies,
        ep=ep,
        dispatch_s=dispatch,
        combine_s=combine,
        profile=profile,
    )
    return step.total_s + (s.ems_lookup_s if cached_blocks else 0.0)


def turn_gain(
    requests: Sequence[Request], model: ModelShape, moe: Moe, profile: HardwareProfile
) -> TurnGain:
    """The later turns' median TTFT without and with EMS (module docstring)."""
    block = profile.serving.block_tokens
    turns = later_turns(requests, block)
    if not turns:
        raise InvalidArgumentError(
            "no request shares leading blocks with an earlier one: not a multi-turn trace",
            field="requests",
        )
    without, with_ems = [], []
    for r, matched in turns:
        t = r.input_tokens
        without.append(idle_ttft_s(model, moe, prompt_tokens=t, cached_blocks=0, profile=profile))
        with_ems.append(
            idle_ttft_s(model, moe, prompt_tokens=t, cached_blocks=matched, profile=profile)
        )
    cached = sum(m * block for _, m in turns) / sum(r.input_tokens for r, _ in turns)
    return TurnGain(
        later_turns=len(turns),
        cached_share=cached,
        ttft_p50_without_s=statistics.median(without),
        ttft_p50_with_s=statistics.median(with_ems),
    )
