"""The cluster manager's cost on cm384 in one process, and how fast it detects a hang.

    .venv/bin/python bench/manager.py                  # time scales 10 and 50, 15 s each
    .venv/bin/python bench/manager.py --measure-s 30

For each time scale, a cm384 supernode runs in this process twice: with the manager's heartbeats
off (an interval of a year: only its idle health streams) and with the profile's heartbeats; the
difference of the process's CPU time over the same wall time is what heartbeating 624 devices
costs. Then an NPU held by a job hangs, and the time to its incident and its replacement is read
in emulated seconds. Prints a table, writes bench/results/manager.json and manager.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from cmemu.v1 import manager_pb2, scheduler_pb2
from emulator.client import faults
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.topology import ServiceKind
from emulator.testing import running_supernode
from services.manager import ManagerState

RESULTS = Path(__file__).parent / "results"
YEAR_S = 365 * 86_400.0


def profile_with(interval_s: float) -> HardwareProfile:
    return dataclasses.replace(
        DEFAULT_PROFILE,
        manager=dataclasses.replace(DEFAULT_PROFILE.manager, heartbeat_interval_s=interval_s),
    )


async def one(scale: float, heartbeats: bool, measure_s: float) -> dict[str, Any]:
    interval = DEFAULT_PROFILE.manager.heartbeat_interval_s if heartbeats else YEAR_S
    async with running_supernode("cm384", time_scale=scale, profile=profile_with(interval)) as sn:
        state = sn.local.service_state(ServiceKind.MANAGER)
        assert isinstance(state, ManagerState)
        await asyncio.sleep(2.0)  # past the first round
        sent0, cpu0, wall0 = state.heartbeats_sent, time.process_time(), time.perf_counter()
        await asyncio.sleep(measure_s)
        wall = time.perf_counter() - wall0
        row: dict[str, Any] = {
            "time_scale": scale,
            "heartbeats": heartbeats,
            "devices": len(state.devices),
            "wall_s": wall,
            "cpu_percent": 100 * (time.process_time() - cpu0) / wall,
            "heartbeats_per_wall_s": (state.heartbeats_sent - sent0) / wall,
            "round_wall_s": state.plan.round_wall_s,
            "round_emulated_s": state.plan.round_wall_s * scale,
            "stretched": state.plan.stretched,
        }
        if heartbeats:
            row.update(await detect_hang(sn, state))
        return row


async def detect_hang(sn: Any, state: ManagerState) -> dict[str, float]:
    clients = sn.clients
    alloc = await clients.scheduler().Allocate(scheduler_pb2.AllocateRequest(job="b", npus=8))
    victim = alloc.npus[3].id
    injected = state.clock.now_ns()
    await faults.inject(clients, "hang", victim)
    while True:
        reply = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
        found = reply.incidents
        mine = [i for i in found if i.device == victim and i.replaced_ns]
        if mine:
            break
        await asyncio.sleep(0.05)
    inc = mine[0]
    await faults.clear(clients, faults.device_fault_id(victim, "hang"))
    return {
        "hang_detected_after_s": (inc.detected_ns - injected) / 1e9,
        "hang_replaced_after_s": (inc.replaced_ns - injected) / 1e9,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"x{r['time_scale']:g} {'on' if r['heartbeats'] else 'off'}" for r in rows]
    ax.bar(labels, [r["cpu_percent"] for r in rows], color=["#999", "#c33"] * (len(rows) // 2))
    ax.set_ylabel("process CPU % (cm384, one process)")
    ax.set_title("cluster manager heartbeats: off vs on")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-s", type=float, default=15.0)
    parser.add_argument("--scales", type=float, nargs="+", default=[10.0, 50.0])
    args = parser.parse_args()
    rows = []
    for scale in args.scales:
        for heartbeats in (False, True):
            rows.append(asyncio.run(one(scale, heartbeats, args.measure_s)))
            r = rows[-1]
            extra = (
                f"  hang: detected +{r['hang_detected_after_s']:.1f} s, replaced "
                f"+{r['hang_replaced_after_s']:.1f} s (emulated)"
                if heartbeats
                else ""
            )
            print(
                f"scale {scale:>4g}  heartbeats {'on ' if heartbeats else 'off'}  "
                f"CPU {r['cpu_percent']:5.1f}%  {r['heartbeats_per_wall_s']:6.1f} checks/s  "
                f"round {r['round_wall_s']:.2f} s wall = {r['round_emulated_s']:.1f} s emulated"
                f"{' (stretched)' if r['stretched'] else ''}{extra}",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "manager.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, RESULTS / "manager.png")
    print(f"wrote {RESULTS / 'manager.json'} and {RESULTS / 'manager.png'}")


if __name__ == "__main__":
    main()
