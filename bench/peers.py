"""The router's and the training jobs' calls to the scheduler and EMS in one process, and the
scheduler's day plans' calls to the router and the training jobs: through the engines directly
(LocalScheduler, LocalEms, LocalDayServing, LocalDayTraining: what services/peers.py now hands
them when the process hosts those engines) against the typed gRPC clients over the process's
shared channel (what they used before, and still use across processes), on one in-process
cm-mini.

Each round: the scheduler's allocate of 2 NPUs, the allocation read back, and the release (a
deployment instance's start and end); EMS's put_sizes of 8 KV blocks, exist of them and
match_prefix (a prompt's prefix lookup and store); a day plan's look at its figures and its
deployment (the router's served tokens and requests in flight, the job's progress). Blocks of
`--rounds` rounds alternate between the two paths `--blocks` times, so both see the same load;
the figures are the medians of the blocks' microseconds per round (wall clock: a shared host
moves both alike).

    python bench/peers.py [--rounds 200] [--blocks 6]
    python bench/peers.py --rounds 20 --blocks 2 --results /tmp/r   # the quickest

Writes bench/results/peers.json and peers.png (microseconds per round, direct beside gRPC).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable

from cmemu.emulator.client.dayplan import RemoteDayServing, RemoteDayTraining
from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.engines.dayplan import DayServing, DayTraining
from cmemu.emulator.engines.ems import EmsState
from cmemu.emulator.engines.ems.local import LocalEms
from cmemu.emulator.engines.peers import JobScheduler
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.engines.scheduler.local import LocalScheduler
from cmemu.emulator.engines.serving.local import LocalDayServing
from cmemu.emulator.engines.serving.peers import KvStore
from cmemu.emulator.engines.training.local import LocalDayTraining
from cmemu.emulator.model.ems.objects import ObjectKind
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import running_supernode
from cmemu.services.manager import ManagerService
from cmemu.services.router import RouterState

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

NAME = "peers"
BLOCK_TOKENS = 128
WHATS = ("scheduler", "ems", "dayplan")


async def _scheduler_round(peer: JobScheduler, i: int) -> None:
    job = f"bench-{i}"
    await peer.allocate(job, 2)
    await peer.allocation(job)
    await peer.release(job)


async def _ems_round(store: KvStore, i: int) -> None:
    tokens = [i] * (8 * BLOCK_TOKENS)
    match = await store.match_prefix(tokens, block_tokens=BLOCK_TOKENS, namespace="bench")
    keys = [f"bench/{i}/{b}" for b in range(8)]
    await store.put_sizes(keys, size=4096, kind=ObjectKind.KV)
    assert all(await store.exist(keys)) and match.matched_blocks == 0
    await store.delete_many(keys)


async def _day_round(peers: tuple[DayServing, DayTraining], i: int) -> None:
    serving, training = peers
    await serving.served_tokens()
    await serving.in_flight("")  # every deployment's (none here)
    assert await training.progress(f"bench-{i}") == ("", 0)


async def _block_us(round_: Callable[[int], Awaitable[None]], rounds: int, start: int) -> float:
    began = time.perf_counter()
    for i in range(start, start + rounds):
        await round_(i)
    return (time.perf_counter() - began) / rounds * 1e6


async def run(rounds: int, blocks: int) -> dict[str, dict[str, float]]:
    async with running_supernode("cm-mini", time_scale=20.0) as sn:
        scheduler = sn.local.service_state(ServiceKind.SCHEDULER)
        ems = sn.local.service_state(ServiceKind.EMS)
        router = sn.local.service_state(ServiceKind.ROUTER)
        manager = sn.local.service_state(ServiceKind.MANAGER)
        assert isinstance(scheduler, SchedulerEngine) and isinstance(ems, EmsState)
        assert isinstance(router, RouterState) and isinstance(manager, ManagerService)
        address = sn.topology.service
        day_grpc = (
            RemoteDayServing(sn.clients.channel_to(address(ServiceKind.ROUTER).address)),
            RemoteDayTraining(sn.clients.channel_to(address(ServiceKind.MANAGER).address)),
        )
        paths: dict[str, tuple[JobScheduler, KvStore, tuple[DayServing, DayTraining]]] = {
            "direct": (
                LocalScheduler(scheduler),
                LocalEms(ems),
                (LocalDayServing(router.engine), LocalDayTraining(manager.training)),
            ),
            "grpc": (SchedulerClient(sn.clients), EmsClient(sn.clients), day_grpc),
        }
        times: dict[str, dict[str, list[float]]] = {p: {w: [] for w in WHATS} for p in paths}
        start = 0
        for _ in range(blocks):
            for path, (peer, store, day) in paths.items():
                rounds_of = {
                    "scheduler": functools.partial(_scheduler_round, peer),
                    "ems": functools.partial(_ems_round, store),
                    "dayplan": functools.partial(_day_round, day),
                }
                for what, round_ in rounds_of.items():
                    times[path][what].append(await _block_us(round_, rounds, start))
                start += rounds
        return {
            path: {what: statistics.median(us) for what, us in by.items()}
            for path, by in times.items()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds per block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per path, alternated")
    outputs.add_option(parser)
    args = parser.parse_args()
    medians = asyncio.run(run(args.rounds, args.blocks))
    for what in WHATS:
        direct, grpc = medians["direct"][what], medians["grpc"][what]
        print(f"{what:9s} round: direct {direct:8.0f} us   gRPC {grpc:8.0f} us   "
              f"({grpc / direct:.1f}x)")  # fmt: skip
    with outputs.figure(args.results, NAME) as (ax,):
        whats = list(WHATS)
        outputs.bars(
            ax, whats, {path: [medians[path][w] for w in whats] for path in medians},
            ylabel="us per round (median of blocks)", log=True,
            title="the scheduler, EMS and the day plans' peers in one process: direct vs gRPC",
        )  # fmt: skip
    outputs.write_json(
        args.results, NAME, {"rounds": args.rounds, "blocks": args.blocks, "us_per_round": medians}
    )
    outputs.announce(args.results, NAME)


if __name__ == "__main__":
    main()
