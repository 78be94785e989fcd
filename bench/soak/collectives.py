"""Collectives (all-to-all uniform and per pair, all-gather, MoE dispatch and combine) over random
sets of 2..64 NPU dies: the fabric's collective path, with its caches and flows. The per-pair form
is kept to `--pair-max-dies` dies (see PAIR_MAX_DIES in config)."""

from __future__ import annotations

import random

import grpc

from bench.soak.config import CALL_TIMEOUT_S, KIB, MIB, log_uniform
from bench.soak.context import Soak
from cmemu.v1 import fabric_pb2

OPS = (
    fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL,
    fabric_pb2.COLLECTIVE_OP_ALL_GATHER,
    fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH,
    fabric_pb2.COLLECTIVE_OP_MOE_COMBINE,
)


class Collectives:
    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls

    async def collective(self, rng: random.Random) -> None:
        ranks = rng.sample(self.soak.dies, rng.randint(2, 64))
        n = len(ranks)
        op = rng.choice(OPS)
        request = fabric_pb2.CollectiveRequest(op=op, ranks=ranks)
        if op == fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL:
            if rng.random() < 0.2:  # per pair: over few dies (see PAIR_MAX_DIES)
                ranks = ranks[: self.soak.args.pair_max_dies]
                n = len(ranks)
                request.ClearField("ranks")
                request.ranks.extend(ranks)
                request.pair_bytes.extend(
                    0 if i // n == i % n else rng.randrange(MIB) for i in range(n * n)
                )
            else:
                request.bytes_per_pair = log_uniform(rng, KIB, 4 * MIB)
        elif op == fabric_pb2.COLLECTIVE_OP_ALL_GATHER:
            request.bytes = log_uniform(rng, KIB, 64 * MIB)
        else:
            request.tokens_per_rank = rng.randint(1, 256)
            request.top_k = rng.randint(1, 8)
        name = fabric_pb2.CollectiveOp.Name(op).removeprefix("COLLECTIVE_OP_").lower()
        done = await self.calls.call(
            f"fabric.collective.{name}",
            self.soak.fabric.Collective(request, timeout=CALL_TIMEOUT_S),
            detail=f"{n} dies",
        )
        if not isinstance(done, grpc.StatusCode) and (
            done.ranks != n or done.complete_ns < done.issue_ns
        ):
            self.calls.wrong(f"collective {name} of {n} ranks answered ranks={done.ranks}")
