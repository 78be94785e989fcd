"""The cluster manager's detection on cm384 in one process: what it costs, and how fast it finds
a hang, at several time scales.

    .venv/bin/python bench/manager.py                  # time scales 10 and 50, 15 s each
    .venv/bin/python bench/manager.py --measure-s 30 --scales 10

For each time scale, a cm384 supernode runs in this process twice: with detection off (a
heartbeat interval of a year: the liveness stream stays idle) and with the profile's interval;
the difference of the process's CPU time over the same wall time is what watching 624 devices
costs (one liveness stream per process: one here). Then an NPU held by a job hangs, and the
time to its incident and its replacement is read in emulated seconds: it should be
`misses_to_fail` heartbeat intervals, whatever the scale. Prints a table, writes
bench/results/manager.json and manager.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from typing import Any

from cmemu.emulator.client import faults
from cmemu.emulator.engines.manager.engine import ManagerEngine
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.services.manager import ManagerService
from cmemu.v1 import manager_pb2, scheduler_pb2

try:
    from bench import outputs
except ImportError:  # run as a script: python bench/NAME.py
    import outputs  # type: ignore[import-not-found, no-redef]

YEAR_S = 365 * 86_400.0


def profile_with(interval_s: float) -> HardwareProfile:
    return dataclasses.replace(
        DEFAULT_PROFILE,
        manager=dataclasses.replace(DEFAULT_PROFILE.manager, heartbeat_interval_s=interval_s),
    )


async def one(scale: float, detecting: bool, measure_s: float) -> dict[str, Any]:
    interval = DEFAULT_PROFILE.manager.heartbeat_interval_s if detecting else YEAR_S
    async with running_supernode("cm384", time_scale=scale, profile=profile_with(interval)) as sn:
        service = sn.local.service_state(ServiceKind.MANAGER)
        assert isinstance(service, ManagerService)
        state = service.engine
        await asyncio.sleep(2.0)  # the streams open
        beats0, cpu0, wall0 = state.watch.beats, time.process_time(), time.perf_counter()
        emulated0 = state.clock.now_s()
        await asyncio.sleep(measure_s)
        wall = time.perf_counter() - wall0
        row: dict[str, Any] = {
            "time_scale": scale,
            "detecting": detecting,
            "devices": len(state.devices),
            "streams": state.watch.streams,
            "wall_s": wall,
            "achieved_scale": (state.clock.now_s() - emulated0) / wall,
            "cpu_percent": 100 * (time.process_time() - cpu0) / wall,
            "beats_per_wall_s": (state.watch.beats - beats0) / wall,
            "incidents": len(state.detector.incidents),
        }
        if detecting:
            row.update(await detect_hang(sn, state))
        return row


async def detect_hang(sn: Supernode, state: ManagerEngine) -> dict[str, float]:
    clients = sn.clients
    alloc = await clients.scheduler().Allocate(scheduler_pb2.AllocateRequest(job="b", npus=8))
    victim = alloc.npus[3].id
    injected = state.clock.now_ns()
    await faults.inject(clients, "hang", victim)
    while True:
        reply = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
        mine = [i for i in reply.incidents if i.device == victim and i.replaced_ns]
        if mine:
            break
        await asyncio.sleep(0.05)
    inc = mine[0]
    await faults.clear(clients, faults.device_fault_id(victim, "hang"))
    return {
        "hang_detected_after_s": (inc.detected_ns - injected) / 1e9,
        "hang_replaced_after_s": (inc.replaced_ns - injected) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-s", type=float, default=15.0)
    parser.add_argument("--scales", type=float, nargs="+", default=[10.0, 50.0])
    outputs.add_option(parser)
    args = parser.parse_args()
    rows = []
    for scale in args.scales:
        for detecting in (False, True):
            rows.append(asyncio.run(one(scale, detecting, args.measure_s)))
            r = rows[-1]
            extra = (
                f"  hang: detected +{r['hang_detected_after_s']:.1f} s, replaced "
                f"+{r['hang_replaced_after_s']:.1f} s (emulated)"
                if detecting
                else ""
            )
            print(
                f"scale {scale:>4g} (achieved {r['achieved_scale']:5.1f})  detection "
                f"{'on ' if detecting else 'off'}  CPU {r['cpu_percent']:5.1f}%  "
                f"{r['beats_per_wall_s']:6.2f} beats/s over {r['streams']} stream(s), "
                f"{r['incidents']} incidents{extra}",
                flush=True,
            )
    cost = {
        f"x{s:g}": next(r["cpu_percent"] for r in rows if r["time_scale"] == s and r["detecting"])
        - next(r["cpu_percent"] for r in rows if r["time_scale"] == s and not r["detecting"])
        for s in args.scales
    }
    for label, percent in cost.items():
        print(f"detection cost at {label}: {percent:+.1f}% of a core (on minus off)")
    doc = {"rows": rows, "detection_cost_percent": cost}
    outputs.write_json(args.results, "manager", doc)
    with outputs.figure(args.results, "manager", ncols=2) as (cpu_ax, hang_ax):
        labels = [f"x{r['time_scale']:g} {'on' if r['detecting'] else 'off'}" for r in rows]
        outputs.bars(
            cpu_ax,
            labels,
            {"process CPU %": [r["cpu_percent"] for r in rows]},
            ylabel="% of a core (cm384, one process)",
            title="detection off vs on",
        )
        on = [r for r in rows if r["detecting"]]
        outputs.bars(
            hang_ax,
            [f"x{r['time_scale']:g}" for r in on],
            {"detected": [r["hang_detected_after_s"] for r in on]},
            targets={
                "3 heartbeat intervals": DEFAULT_PROFILE.manager.misses_to_fail
                * DEFAULT_PROFILE.manager.heartbeat_interval_s
            },
            ylabel="emulated s from the hang",
            title="a hang found",
        )
    outputs.announce(args.results, "manager")


if __name__ == "__main__":
    main()
