"""The mixed load: `--concurrency` workers, each with its own seeded RNG (the seed fixes what each
worker does, not how the workers interleave), drawing operations by weight until the run ends;
worker 0 also puts a big object every `--big-every` seconds."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from bench.soak.churn import Churn
from bench.soak.collectives import Collectives
from bench.soak.context import Soak
from bench.soak.ems import EmsLoad
from bench.soak.ems_batch import EmsBatches
from bench.soak.messages import MessageLoad
from bench.soak.ub import UbLoad

Op = Callable[[random.Random], Awaitable[None]]


class Load:
    """The operations and their weights (the order is part of what the seed fixes)."""

    def __init__(
        self,
        soak: Soak,
        *,
        ub: UbLoad,
        messages: MessageLoad,
        churn: Churn,
        collectives: Collectives,
        ems: EmsLoad,
        batches: EmsBatches,
    ) -> None:
        self.soak = soak
        self.ems = ems
        weighted: tuple[tuple[Op, int], ...] = (
            (ub.write, 16),
            (ub.read, 12),
            (ub.atomic, 10),
            (messages.send, 8),
            (ub.bulk_transfer, 5),
            (churn.churn, 3),
            (collectives.collective, 8),
            (ems.put_one, 12),
            (ems.get_one, 14),
            (ems.delete_one, 3),
            (batches.batch, 6),
        )
        self.ops = [op for op, _ in weighted]
        self.weights = [w for _, w in weighted]

    async def worker(self, index: int) -> None:
        soak = self.soak
        rng = random.Random(soak.args.seed * 1000 + index)
        next_big = time.monotonic() + 1.0
        while time.monotonic() < soak.stop_at:
            try:
                if index == 0 and time.monotonic() >= next_big:
                    next_big = time.monotonic() + soak.args.big_every
                    await self.ems.big_object(rng)
                else:
                    await rng.choices(self.ops, self.weights)[0](rng)
            except Exception as exc:  # the soak's own bug: recorded, reported, fails the run
                soak.figures.client_exceptions.append(f"t={soak.figures.now():.1f}s {exc!r}")
                await asyncio.sleep(0.1)
