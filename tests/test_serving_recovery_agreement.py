"""The live deployment and the discrete-event simulation agree under a fault too (issue 11): the
small workload through the router's OpenAI endpoint on a live cm-mini while the scheduler marks a
decode NPU failed and then replaces it, and the same workload through the simulator with that NPU
lost and replaced at the instants the live deployment isolated and restored it: the same tokens,
and tokens per second after the recovery within 5%."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from cmemu.emulator.client.replay import Outcome, replay
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.des import DieLoss, simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.workload import generate, parse_workload
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import manager_pb2, router_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=1.0, cache_from_ems_s=0.5),
)
TIME_SCALE = 4.0
TOLERANCE = 0.05
FAIL_AT_S = 1.5  # emulated seconds after the first arrival: requests are decoding by then


@dataclass
class Live:
    outcomes: list[Outcome]
    deployment: router_pb2.Deployment  # after the restore
    stats: router_pb2.ServingStats
    replacement: str
    start_s: float  # emulated instant the replay started


async def _live(spec_text: str, requests: list[Request], block: int) -> Live:
    """The replay on a live cm-mini, failing and replacing the decode instance's first NPU."""
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as sn:
        await sn.clients.manager().SetMode(
            manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
        )  # this test is the controller
        router = sn.clients.router()
        deployed = await router.Deploy(
            router_pb2.DeployRequest(name="small", spec_yaml=spec_text, wait=True)
        )
        decode = next(i for i in deployed.instances if i.role == "decode")
        topology = sn.local.topology if sn.local is not None else sn.topology
        assert topology.epoch_wall_s is not None
        assert sn.local.time is not None  # the supernode's own clock: this process owns it
        clock = sn.local.time.timeline
        http = topology.service(ServiceKind.ROUTER).http_address
        start_s = clock.now_ns() / 1e9
        replaying = asyncio.create_task(
            replay(f"http://{http}", "small", requests, clock=clock, block=block)
        )

        async def until(check: str) -> router_pb2.Deployment:
            while True:
                got = await router.GetDeployment(router_pb2.GetDeploymentRequest(name="small"))
                if getattr(got, check):
                    return got
                await asyncio.sleep(0.01)

        await clock.sleep_until(round((start_s + FAIL_AT_S) * 1e9))
        scheduler = sn.clients.scheduler()
        await scheduler.MarkFailed(scheduler_pb2.MarkRequest(npu=decode.npus[0]))
        await until("last_isolated_ns")
        swapped = await scheduler.Replace(
            scheduler_pb2.ReplaceRequest(job=decode.allocation, npu=decode.npus[0])
        )
        restored = await until("last_restored_ns")
        outcomes = await replaying
        stats = await router.GetStats(router_pb2.GetStatsRequest(name="small"))
    return Live(
        outcomes=outcomes,
        deployment=restored,
        stats=stats,
        replacement=swapped.replaced[0].new_npu,
        start_s=start_s,
    )


async def test_live_and_simulation_agree_after_a_recovery() -> None:
    spec_text = (EXAMPLES / "deployments" / "small.yaml").read_text()
    deployment = parse_deployment(yaml.safe_load(spec_text), PROFILE)
    workload = parse_workload(yaml.safe_load((EXAMPLES / "workloads" / "small.yaml").read_text()))
    block = PROFILE.serving.block_tokens
    requests = list(generate(workload, block_tokens=block))
    live = await _live(spec_text, requests, block)
    outcomes, stats, restored, start_s = live.outcomes, live.stats, live.deployment, live.start_s

    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert stats.requests_dropped == 0 and stats.requests_failed == 0
    lost_s = restored.last_isolated_ns / 1e9 - start_s
    back_s = restored.last_restored_ns / 1e9 - start_s
    first_arrival = min(o.arrival_ns for o in outcomes) / 1e9 - start_s
    # the simulator's clock starts at the first arrival; the live one at the replay's start
    shift = first_arrival - requests[0].arrival_s
    failure = DieLoss(
        at_s=lost_s - shift,
        instance="decode-0",
        npu=0,
        restored_s=back_s - shift,
        replacement=live.replacement,
    )
    sim = simulate(deployment, requests, profile=PROFILE, failures=[failure])
    rec = sim.recorder
    assert rec.failed == 0
    assert sum(t for _, t in rec.finish.values()) == sum(o.completion_tokens for o in outcomes)

    # tokens per second of the requests that arrived after the restore
    after_sim = [r for r in requests if r.arrival_s >= failure.restored_s]  # type: ignore[operator]
    assert after_sim, "the restore came after the last arrival: nothing to compare"
    sim_tokens = sum(rec.finish[r.id][1] for r in after_sim)
    sim_end = max(rec.finish[r.id][0] for r in after_sim)
    sim_tps = sim_tokens / (sim_end - failure.restored_s)  # type: ignore[operator]
    ids = {r.id for r in after_sim}
    live_after = [o for o in outcomes if o.id in ids]
    live_tokens = sum(o.completion_tokens for o in live_after)
    live_end = max(o.last_ns for o in live_after) / 1e9 - start_s - shift
    live_tps = live_tokens / (live_end - failure.restored_s)  # type: ignore[operator]
    print(
        f"after recovery: tokens/s live {live_tps:.1f} sim {sim_tps:.1f} "
        f"(lost at {failure.at_s:.3f} s, back at {failure.restored_s:.3f} s; "
        f"{stats.requests_retried} requests retried)"
    )
    assert live_tokens == sim_tokens
    assert abs(live_tps / sim_tps - 1) < TOLERANCE
