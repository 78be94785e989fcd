"""Dynamic PD against a fixed split on the live router (issue 24 item 4, the live half;
emulator/engines/serving/pdlive.py), for `python bench/pd.py --live`.

An in-process cm-mini serves DeepSeek-R1 as three instances of 2 NPUs (two prefill, one decode at
the start; a decode die holds one request, the SLO operating point of a 2-NPU unit), once under
`pd: dynamic` and once under `fixed`, each on its own fresh supernode. The same mix goes to both
over HTTP, paced on the emulated clock: decode-heavy phases (64-token prompts, 300-token answers,
one every 2 s: the decode work of about two units) alternate with prefill-heavy ones (8,000-token
prompts, 4-token answers, one every 0.7 s: the prefill work of about 1.1 units, with headroom
two). Goodput counts the
requests whose TTFT and TPOT (the endpoint's emulated timings) meet the deployment's targets, per
emulated second of the mix.

The profile is a what-if: a die holds 512 GiB (DeepSeek-R1's weights over a 2-NPU unit must fit
for the cost model to rate it) and a role change reloads in 4 s (the published 320 s would need
phases of an hour: wall time this bench does not spend).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import router_pb2

PROFILE = replace(
    DEFAULT_PROFILE,
    npu=replace(DEFAULT_PROFILE.npu, hbm_bytes_per_die=512 * 2**30),
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
)
TIME_SCALE = 50.0
SPEC: dict[str, Any] = {
    "model": "deepseek-r1",
    "decode": {"instances": 1, "npus": 2, "max_batch_per_die": 1},
    "prefill": {"instances": 2, "npus": 2},
}
PHASE_S = 90.0
PD = {"interval_s": 5, "window_s": 15, "horizon_s": PHASE_S, "headroom": 0.2}
# (prompt tokens, output tokens, emulated seconds between requests, emulated seconds)
PHASES = ((64, 300, 2.0, PHASE_S), (8000, 4, 0.7, PHASE_S))
# the runs: (policy, prefill instances, decode instances at the start)
RUNS = {"dynamic": ("dynamic", 2, 1), "fixed 2:1": ("fixed", 2, 1), "fixed 1:2": ("fixed", 1, 2)}


@dataclass(kw_only=True)
class LiveRun:
    policy: str
    duration_s: float
    submitted: int = 0
    good: int = 0
    good_by_phase: list[int] = field(default_factory=list)  # of each phase's requests
    failed: int = 0
    switches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def goodput_per_s(self) -> float:
        return self.good / self.duration_s

    @property
    def slo_attainment(self) -> float:
        return self.good / self.submitted if self.submitted else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "duration_s": self.duration_s,
            "submitted": self.submitted,
            "good": self.good,
            "good_by_phase": self.good_by_phase,
            "failed": self.failed,
            "goodput_per_s": self.goodput_per_s,
            "slo_attainment": self.slo_attainment,
            "switches": self.switches,
        }


async def _serve(sn: Supernode, name: str, cycles: int) -> list[tuple[int, dict[str, Any] | None]]:
    """The mix, `cycles` times over; each request's phase and emulated timing (None: it
    failed)."""
    assert sn.time is not None
    clock = Timeline(sn.time.clock)
    base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}"

    async def one(
        session: aiohttp.ClientSession, phase: int, prompt: int, output: int, i: int
    ) -> tuple[int, dict[str, Any] | None]:
        body = {
            "model": name,
            "prompt": [(13 * i + j) % 9000 + 5 for j in range(prompt)],
            "max_tokens": output,
            "ignore_eos": True,
        }
        async with session.post(f"{base}/v1/completions", json=body) as response:
            doc = await response.json()
            return phase, (doc.get("cmemu") if response.status == 200 else None)

    sent: list[asyncio.Task[tuple[int, dict[str, Any] | None]]] = []
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for cycle in range(cycles):
            for k, (prompt, output, gap, seconds) in enumerate(PHASES):
                phase = cycle * len(PHASES) + k
                for _ in range(round(seconds / gap)):
                    task = asyncio.create_task(one(session, phase, prompt, output, len(sent)))
                    sent.append(task)
                    await clock.sleep(gap)
        return list(await asyncio.gather(*sent))


async def run_live(policy: str, prefill: int, decode: int, cycles: int) -> LiveRun:
    """One run of the mix on a fresh cm-mini under `policy`, from `prefill`:`decode`."""
    spec = {
        **SPEC,
        "decode": {**SPEC["decode"], "instances": decode},
        "prefill": {**SPEC["prefill"], "instances": prefill},
        "pd": {"policy": policy, **PD},
    }
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as sn:
        router = sn.clients.router()
        await router.Deploy(
            router_pb2.DeployRequest(name="pd", spec_yaml=json.dumps(spec), wait=True)
        )
        timings = await _serve(sn, "pd", cycles)
        deployed = await router.GetDeployment(router_pb2.GetDeploymentRequest(name="pd"))
    ttft_ns = 2.0e9  # the deployment's targets (prefill.ttft_target_s, decode.tpot_target_s)
    tpot_ns = 0.05e9
    run = LiveRun(
        policy=f"{policy} from {prefill}:{decode}", duration_s=cycles * sum(p[3] for p in PHASES)
    )
    run.submitted = len(timings)
    run.good_by_phase = [0] * (cycles * len(PHASES))
    for phase, t in timings:
        if t is None:
            run.failed += 1
        elif t["ttft_ns"] <= ttft_ns and (t["tpot_ns"] or 0) <= tpot_ns:
            run.good += 1
            run.good_by_phase[phase] += 1
    run.switches = [
        {
            "at_s": w.at_ns / 1e9,
            "to": w.to,
            "instances": list(w.instances),
            "joined_s": w.joined_ns / 1e9,
        }
        for w in deployed.pd.switches
    ]
    return run


def live(cycles: int) -> dict[str, LiveRun]:
    configure_logging("warning")  # the figures, not every UB submit of three supernodes
    return {name: asyncio.run(run_live(*run, cycles)) for name, run in RUNS.items()}


def report_live(runs: dict[str, LiveRun]) -> None:
    for name, r in runs.items():
        print(
            f"live {name:<9} goodput {r.goodput_per_s:5.2f} req/s, SLO attainment "
            f"{r.slo_attainment:6.1%} of {r.submitted} requests ({r.failed} failed), "
            f"{len(r.switches)} switches; good by phase {r.good_by_phase}"
        )
        for w in r.switches:
            print(
                f"    {w['at_s']:6.1f} s: {', '.join(w['instances'])} to {w['to']}, "
                f"joined at {w['joined_s']:.1f} s"
            )
