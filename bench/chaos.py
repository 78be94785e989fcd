"""Chaos at speed: a 10-emulated-minute scenario on cm384 in one process, and a 40-day training
run in model mode with NPU failures drawn from an MTBF.

1. Live: cm384 (624 device servers and the services) in this process at `--time-scale` (>= 10),
   the library's mixed-storm scenario (serving with a steady load, a training job, EMS objects;
   crashes, a hang, a die down, a slow NPU, a flapping link, repeated crashes with jitter) held
   for exactly `--minutes` emulated minutes. Prints the wall time of the scenario (target: 60 s
   for 10 minutes), the verdict, every fault's time to recovery (emulated), and the pacing: how
   late each injection went in after its emulated instant, and how late each request's reply
   reached the client after the emulated instant of its last token.
2. Model mode: `simulate_training` (emulator/model/training/longrun.py, as `cmemu simulate
   training` runs it) for `--days` days on `--npus` NPUs of cm384 at several MTBFs per NPU:
   failures, goodput, recovery times; wall time of each run (target: under a minute).

    python bench/chaos.py [--time-scale 20] [--minutes 10] [--days 40] [--npus 256]
                          [--mtbf-hours 10000,50000,200000]

Writes bench/results/chaos.json and bench/results/chaos.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

from cmemu.emulator.model.chaos.observed import RequestSample
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.training.longrun import simulate_training
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.testing import running_supernode

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).parent / "results"
SCENARIO = "mixed-storm"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _after(ns: int | None, at_ns: int) -> float | None:
    return None if ns is None else max(0, ns - at_ns) / 1e9


def _reply_lag_s(samples: list[RequestSample]) -> list[float]:
    return [(s.received_ns - s.done_ns) / 1e9 for s in samples if s.ok and s.received_ns]


async def live(time_scale: float, minutes: float) -> tuple[dict[str, Any], RunResult]:
    scenario = dataclasses.replace(files.load(files.find(SCENARIO)), duration_s=minutes * 60)
    boot = time.perf_counter()
    async with running_supernode("cm384", time_scale=time_scale) as sn:
        booted_s = time.perf_counter() - boot
        wall = time.perf_counter()
        result = await run_scenario(sn.clients, scenario, RunOptions(early_end=False))
        total_wall_s = time.perf_counter() - wall
    obs = result.observations
    span_s = (obs.end_ns - obs.start_ns) / 1e9
    lag = [(i.at_ns - i.planned_ns) / 1e9 for i in obs.injections if i.planned_ns]
    replies = _reply_lag_s(obs.requests)
    out = {
        "preset": "cm384",
        "time_scale": time_scale,
        "scenario": scenario.name,
        "boot_wall_s": booted_s,
        "run_wall_s": result.wall_s,  # workloads started, faults, watching, clean-up
        "setup_wall_s": result.setup_wall_s,  # the workloads started (weights loaded)
        "scenario_wall_s": result.scenario_wall_s,  # the emulated span, faults to the end
        "total_wall_s": total_wall_s,
        "emulated_span_s": span_s,  # from the workloads being up to the end
        "achieved_scale": result.pace.achieved_scale if result.pace else None,
        "ok": result.ok,
        "checks": [dataclasses.asdict(c) for c in result.verdict.checks],
        "recoveries": [
            {
                "step": r.injection.label,
                "kind": r.injection.kind,
                "target": r.injection.target,
                "at_s": (r.injection.at_ns - obs.start_ns) / 1e9,
                "recovery_s": r.recovery_s,
                # each fault's own four times, emulated seconds after it went in (None: never)
                "detected_s": _after(r.detected_ns, r.injection.at_ns),
                "isolated_s": _after(r.isolated_ns, r.injection.at_ns),
                "restored_s": _after(r.restored_ns, r.injection.at_ns),
                "slo_back_s": _after(r.slo_back_ns, r.injection.at_ns),
                "status": r.status,
                "workloads": list(r.workloads),
            }
            for r in result.recoveries
        ],
        "injection_lag_emulated_s": {
            "median": statistics.median(lag) if lag else 0.0,
            "max": max(lag, default=0.0),
        },
        "reply_lag_emulated_s": {
            "median": statistics.median(replies) if replies else 0.0,
            "p99": _pct(replies, 0.99),
            "count": len(replies),
        },
        "requests": len(obs.requests),
        "requests_failed": sum(not s.ok for s in obs.requests),
        "notes": result.notes,
    }
    return out, result


def model_runs(days: float, npus: int, mtbfs: list[float]) -> list[dict[str, Any]]:
    rows = []
    for mtbf in mtbfs:
        wall = time.perf_counter()
        result = simulate_training(days=days, mtbf_hours=mtbf, npus=npus, preset="cm384")
        rows.append({**result.summary(), "wall_s": time.perf_counter() - wall,
                     "recovery_s": list(result.recovery_s)})  # fmt: skip
    return rows


def _plot(live_out: dict[str, Any], result: RunResult, rows: list[dict[str, Any]]) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    start = result.observations.start_ns
    for n, r in enumerate(result.recoveries):
        at = (r.injection.at_ns - start) / 60e9
        end = at + (r.recovery_s if r.recovery_s is not None else 0) / 60
        left.plot([at, end], [n, n], "-", lw=4, color="tab:green" if r.recovery_s else "tab:red")
        left.plot([at], [n], "kx")
    left.set_yticks(range(len(result.recoveries)),
                    [f"{r.injection.label} {r.injection.kind}" for r in result.recoveries],
                    fontsize=7)  # fmt: skip
    left.set(xlabel="emulated minutes", title=f"cm384, time scale {live_out['time_scale']:g}: "
             f"{live_out['scenario_wall_s']:.0f} s wall; fault (x) to recovery")  # fmt: skip
    for row in rows:
        recoveries = sorted(row["recovery_s"])
        if recoveries:
            right.plot(recoveries, [(i + 1) / len(recoveries) for i in range(len(recoveries))],
                       label=f"MTBF {row['mtbf_hours']:,.0f} h: goodput {row['goodput']:.3f}, "
                       f"{row['failures']} failures")  # fmt: skip
    right.axvline(600, ls="--", color="grey")
    right.set(xlabel="recovery time (emulated s)", ylabel="share of failures",
              title=f"model mode: {rows[0]['days']:g} days on {rows[0]['npus']} NPUs")  # fmt: skip
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "chaos.png", dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--days", type=float, default=40.0)
    parser.add_argument("--npus", type=int, default=256)
    default_mtbf = DEFAULT_PROFILE.training.mtbf_hours_per_npu
    parser.add_argument("--mtbf-hours", default=f"10000,{default_mtbf:g},200000")
    args = parser.parse_args()
    configure_logging("error")

    live_out, result = asyncio.run(live(args.time_scale, args.minutes))
    print(
        f"live: {args.minutes:g} emulated minutes of {SCENARIO} on cm384 in one process at time "
        f"scale {args.time_scale:g}: {live_out['emulated_span_s']:.0f} s emulated in "
        f"{live_out['scenario_wall_s']:.1f} s wall (target 60 s; achieved scale "
        f"{live_out['achieved_scale'] or 0:.3g}); before it, boot "
        f"{live_out['boot_wall_s']:.1f} s and the workloads' start "
        f"{live_out['setup_wall_s']:.1f} s (weights loading in emulated time); verdict "
        f"{'PASS' if result.ok else 'FAIL'}"
    )
    for c in result.verdict.checks:
        print(f"  {'PASS' if c.ok else 'FAIL'} {c.name}: {c.measured}")
    for r in live_out["recoveries"]:
        times = "  ".join(
            f"{k} {'-' if r[f'{k}_s'] is None else format(r[f'{k}_s'], '.1f')}"
            for k in ("detected", "isolated", "restored", "slo_back")
        )
        print(f"  {r['step']:<11} {r['kind']:<17} at {r['at_s']:6.1f} s: {times}  ({r['status']})")
    il, rl = live_out["injection_lag_emulated_s"], live_out["reply_lag_emulated_s"]
    ms = 1e3 / args.time_scale
    print(
        f"  pacing: injections late by median {il['median']:.2f} s, max {il['max']:.2f} s "
        f"emulated ({il['median'] * ms:.0f}/{il['max'] * ms:.0f} ms wall); replies "
        f"reach the client a median {rl['median']:.2f} s, p99 {rl['p99']:.2f} s emulated after "
        f"their last token ({rl['median'] * ms:.0f}/{rl['p99'] * ms:.0f} ms wall, "
        f"{rl['count']} requests, {live_out['requests_failed']} failed)"
    )

    mtbfs = [float(x) for x in args.mtbf_hours.split(",")]
    rows = model_runs(args.days, args.npus, mtbfs)
    print(f"model mode: {args.days:g}-day training runs on {args.npus} NPUs of cm384:")
    for row in rows:
        print(
            f"  MTBF {row['mtbf_hours']:>9,.0f} h per NPU: {row['failures']:>4} failures, "
            f"goodput {row['goodput']:.4f}, recovery mean {row['recovery_mean_s']:.0f} s, "
            f"p99 {row['recovery_p99_s']:.0f} s, max {row['recovery_max_s']:.0f} s "
            f"({row['recovered_within_target']:.1%} within {row['recovery_target_s']:.0f} s); "
            f"{row['wall_s'] * 1e3:.0f} ms wall (target 60 s)"
        )
    RESULTS.mkdir(exist_ok=True)
    doc = {"live": live_out, "model": [{k: v for k, v in r.items() if k != "recovery_s"}
                                       for r in rows]}  # fmt: skip
    (RESULTS / "chaos.json").write_text(json.dumps(doc, indent=2) + "\n")
    _plot(live_out, result, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
