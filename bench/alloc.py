"""Allocation rate of a 384-NPU supernode against a 224-NPU system, for each allocation policy.

The paper behind CloudMatrix384 reports that with jobs taking blocks of about 10 NPUs on average,
a 384-NPU supernode keeps above 94% of its NPUs allocated where 224-NPU systems stay below 91%.
This replays one seeded job stream through the scheduler's own model (emulator/model/scheduler,
no servers) on each system:

- jobs arrive as a Poisson stream at an offered load of LOAD (NPU-hours asked per NPU-hour the
  system has), so that jobs are waiting nearly all the time; durations are exponential; block
  sizes and shapes come from JOB_MIX (mean about 10 NPUs; jobs of 8 or more ask for whole
  nodes, as a training job on 8-NPU servers does); HIGH_PRIORITY of them jump the queue;
- waiting jobs start in priority order, first come first served within a priority, the head of
  the queue blocking the rest (no backfill): queue.PendingQueue;
- allocation rate: the time-averaged fraction of all NPUs allocated while at least one job
  waits (the idle NPUs a waiting job could not use are the loss the figure measures).

Both systems see the same mix and the same offered load per NPU; each (system, policy) runs
`--seeds` streams and reports their mean. Writes bench/results/alloc.json and alloc.png.

    python bench/alloc.py [--jobs 20000] [--seeds 5]   (about a minute on one core)
    python bench/alloc.py --jobs 500 --seeds 1 --results /tmp/r   # the quickest
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cmemu.emulator.model.errors import CapacityError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scheduler import POLICIES, Inventory, JobRequest, PendingQueue, Scheduler

try:
    from bench import outputs, progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]

# (NPUs, share of jobs, whole nodes): the job stream's block sizes, mean 10.05 NPUs
JOB_MIX: tuple[tuple[int, float, bool], ...] = (
    (1, 0.15, False),
    (2, 0.15, False),
    (4, 0.20, False),
    (8, 0.20, True),
    (16, 0.15, True),
    (32, 0.15, True),
)
SYSTEMS = {"cm384": 48, "224-NPU": 28}  # nodes of 8 NPUs (racks of 4 nodes, as cm384's)
LOAD = 1.2  # offered load: jobs always wait once the stream is under way
MEAN_DURATION_H = 1.0
HIGH_PRIORITY = 0.1
PUBLISHED = {"cm384": 0.94, "224-NPU": 0.91}  # above 94%, below 91%


@dataclass(frozen=True, kw_only=True)
class Job:
    arrival_h: float
    duration_h: float
    request: JobRequest


def job_stream(npus: int, jobs: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    sizes = [s for s, _, _ in JOB_MIX]
    weights = [w for _, w, _ in JOB_MIX]
    whole = {s: w for s, _, w in JOB_MIX}
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
    rate_per_h = LOAD * npus / (mean_size * MEAN_DURATION_H)
    stream: list[Job] = []
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(rate_per_h)
        size = rng.choices(sizes, weights)[0]
        request = JobRequest(
            job=f"j{i}",
            npus=size,
            whole_nodes=whole[size],
            priority=1 if rng.random() < HIGH_PRIORITY else 0,
        )
        stream.append(
            Job(arrival_h=t, duration_h=rng.expovariate(1 / MEAN_DURATION_H), request=request)
        )
    return stream


@dataclass(frozen=True, kw_only=True)
class Run:
    system: str
    npus: int
    policy: str
    seed: int
    allocation_rate: float  # while jobs wait
    utilisation: float  # over the whole replay
    waiting_share: float  # of the replay's time, some job waited
    mean_wait_h: float
    wall_s: float


def replay(system: str, nodes: int, policy: str, stream: list[Job], seed: int) -> Run:
    started = time.perf_counter()
    inventory = Inventory.from_counts(nodes=nodes, profile=DEFAULT_PROFILE)
    s = Scheduler(inventory, spares=0, default_policy=policy)
    queue = PendingQueue()
    by_name = {j.request.job: j for j in stream}
    events: list[tuple[float, int, str]] = []  # (time, 0 release / 1 arrival, job)
    for j in stream:
        heapq.heappush(events, (j.arrival_h, 1, j.request.job))
    now = 0.0
    busy_waiting = waiting = busy_total = 0.0
    waits: list[float] = []
    while events:
        t, kind, name = heapq.heappop(events)
        span = t - now
        busy_total += s.allocated_count * span
        if len(queue):
            waiting += span
            busy_waiting += s.allocated_count * span
        now = t
        if kind == 0:
            s.release(name)
        else:
            queue.push(by_name[name].request)
        while len(queue):
            head = queue.head()
            if head.npus > s.free_count:
                break
            try:
                s.allocate(head, 0)
            except CapacityError:
                break  # free NPUs, but not in the shape it asks for: it blocks the queue
            queue.pop()
            job = by_name[head.job]
            waits.append(now - job.arrival_h)
            heapq.heappush(events, (now + job.duration_h, 0, head.job))
    npus = inventory.size
    return Run(
        system=system,
        npus=npus,
        policy=policy,
        seed=seed,
        allocation_rate=busy_waiting / (npus * waiting) if waiting else 0.0,
        utilisation=busy_total / (npus * now),
        waiting_share=waiting / now,
        mean_wait_h=statistics.fmean(waits),
        wall_s=time.perf_counter() - started,
    )


def plot(summary: dict[str, dict[str, float]], directory: Path) -> None:
    policies = list(POLICIES)
    with outputs.figure(directory, "alloc", size=(7, 4)) as (ax,):
        outputs.bars(
            ax,
            policies,
            {system: [100 * summary[system][p] for p in policies] for system in SYSTEMS},
            targets={f"published {s}": 100 * level for s, level in PUBLISHED.items()},
            ylabel="NPUs allocated while jobs wait (%)",
            title="Allocation rate, blocks of ~10 NPUs (seeded job stream)",
            value_format="%.1f",
        )
        ax.set_ylim(70, 100)
        ax.legend(loc="lower left", fontsize=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per stream on cm384")
    parser.add_argument("--seeds", type=int, default=5)
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.jobs < 1 or args.seeds < 1:
        parser.error("--jobs and --seeds must be at least 1")
    runs: list[Run] = []
    total = len(SYSTEMS) * args.seeds * len(POLICIES)
    with progress.steps("replaying job streams", total) as advance:
        for system, nodes in SYSTEMS.items():
            npus = nodes * DEFAULT_PROFILE.node.npus
            jobs = round(args.jobs * npus / 384)  # the same span of time on both systems
            for seed in range(args.seeds):
                stream = job_stream(npus, jobs, seed)
                for policy in POLICIES:
                    runs.append(replay(system, nodes, policy, stream, seed))
                    advance(1)
    summary = {
        system: {
            p: statistics.fmean(
                r.allocation_rate for r in runs if (r.system, r.policy) == (system, p)
            )
            for p in POLICIES
        }
        for system in SYSTEMS
    }
    mean_size = sum(s * w for s, w, _ in JOB_MIX) / sum(w for _, w, _ in JOB_MIX)
    print(f"job mix: mean block {mean_size:.2f} NPUs, offered load {LOAD}, {args.seeds} seeds")
    print(
        f"{'policy':<16}"
        + "".join(f"{s:>10}" for s in SYSTEMS)
        + "   (allocation rate while jobs wait)"
    )
    for p in POLICIES:
        print(f"{p:<16}" + "".join(f"{100 * summary[s][p]:>9.1f}%" for s in SYSTEMS))
    print("published: cm384 above 94%, 224-NPU systems below 91%")
    doc = {
        "job_mix": [{"npus": s, "share": w, "whole_nodes": wn} for s, w, wn in JOB_MIX],
        "mean_block_npus": mean_size,
        "offered_load": LOAD,
        "mean_duration_h": MEAN_DURATION_H,
        "high_priority_share": HIGH_PRIORITY,
        "published": PUBLISHED,
        "allocation_rate": summary,
        "runs": [asdict(r) for r in runs],
    }
    outputs.write_json(args.results, "alloc", doc)
    plot(summary, args.results)
    outputs.announce(args.results, "alloc")


if __name__ == "__main__":
    main()
