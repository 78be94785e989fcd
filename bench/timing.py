"""The same verdict at every time scale, on a quiet host and on a busy one.

Each shipped scenario (scenarios/*.yaml) runs on a fresh in-process supernode of its preset at
each time scale, alone and beside a two-core CPU hog (stress-ng --cpu 2): every cell's outcome
(PASS / FAIL / ABORTED), every fault's recovery time (emulated seconds), the achieved time
scale, the worst lateness any process reported (emulated seconds) and the longest stall cut out
of emulated time. Then the verdicts are compared across cells (they must be equal) and each
fault's recovery with its time-scale-1 value (within 10%).

    python bench/timing.py              # every scenario, x1 x20 x100, hog on and off
    python bench/timing.py --scenarios npu-crash-decode --scales 1 20 100
    python bench/timing.py --quick      # one scenario at x20 and x100

A time-scale-1 cell lasts as long as its scenario in wall time (minutes each). Writes
bench/results/timing.json and timing.png.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cmemu.emulator.model.chaos.units import format_s
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.run import RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.testing import running_supernode

try:
    from bench import outputs
except ImportError:  # run as a script: python bench/NAME.py
    import outputs  # type: ignore[import-not-found, no-redef]

TOLERANCE = 0.10  # a fault's recovery at any scale, against its time-scale-1 value
QUICK = (["npu-crash-decode"], [20.0, 100.0])


@contextmanager
def hog(on: bool) -> Iterator[None]:
    """Both cores busy for as long as the block runs (stress-ng, Debian's)."""
    if not on:
        yield
        return
    stress = shutil.which("stress-ng")
    if stress is None:
        raise SystemExit("stress-ng is not installed: apt-get install stress-ng")
    proc = subprocess.Popen([stress, "--cpu", "2", "--quiet"])
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def cell(name: str, scale: float, busy: bool) -> dict[str, Any]:
    scenario = files.load(files.find(name))
    started = time.monotonic()
    with hog(busy):
        async with running_supernode(scenario.preset or "cm-mini", time_scale=scale) as sn:
            result: RunResult = await run_scenario(sn.clients, scenario)
    pace = result.pace
    return {
        "scenario": name,
        "time_scale": scale,
        "hog": busy,
        "outcome": result.outcome,
        "failed_checks": [c.name for c in result.verdict.checks if not c.ok],
        "recoveries": {
            f"{r.injection.label} {r.injection.kind}": r.recovery_s for r in result.recoveries
        },
        "achieved_scale": pace.achieved_scale if pace else None,
        "worst_lag_emulated_s": pace.worst_lag_emulated_s if pace else None,
        "longest_stall_s": pace.longest_stall_s if pace else None,
        "aborted": pace.aborted if pace else "",
        "wall_s": time.monotonic() - started,
    }


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: one verdict in every cell? each recovery within TOLERANCE of x1's?"""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == name]
        verdicts = {r["outcome"] for r in mine}
        base = next((r for r in mine if r["time_scale"] == 1.0 and not r["hog"]), None)
        drift: dict[str, float] = {}
        if base is not None:
            for r in mine:
                for fault, took in r["recoveries"].items():
                    ref = base["recoveries"].get(fault)
                    if ref and took is not None:
                        key = f"x{r['time_scale']:g}{' hog' if r['hog'] else ''} {fault}"
                        drift[key] = took / ref - 1
        out[name] = {
            "same_verdict": len(verdicts) == 1,
            "verdicts": sorted(verdicts),
            "recovery_drift": drift,
            "within_tolerance": all(abs(d) <= TOLERANCE for d in drift.values()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=None, help="default: every one")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 20.0, 100.0])
    parser.add_argument("--hog", choices=("both", "on", "off"), default="both")
    parser.add_argument("--quick", action="store_true", help="one scenario at x20 and x100")
    outputs.add_option(parser)
    args = parser.parse_args()
    configure_logging("error")
    names = args.scenarios or [s.stem for s in files.library()]
    scales = args.scales
    if args.quick:
        names, scales = QUICK
    busy = {"both": (False, True), "on": (True,), "off": (False,)}[args.hog]
    rows = []
    for name in names:
        for scale in scales:
            for on in busy:
                row = asyncio.run(cell(name, scale, on))
                rows.append(row)
                recs = ", ".join(
                    f"{f} {format_s(s) if s is not None else 'not recovered'}"
                    for f, s in row["recoveries"].items()
                )
                print(
                    f"{name:<24} x{scale:<5g} {'hog ' if on else 'idle'} {row['outcome']:<7} "
                    f"achieved x{row['achieved_scale'] or 0:.3g}, worst lag "
                    f"{row['worst_lag_emulated_s'] or 0:.3f} s, stall "
                    f"{row['longest_stall_s'] or 0:.2f} s, {row['wall_s']:.0f} s wall; {recs}",
                    flush=True,
                )
    summary = compare(rows)
    for name, s in summary.items():
        print(
            f"{name}: {'same verdict' if s['same_verdict'] else 'VERDICTS DIFFER'} "
            f"({', '.join(s['verdicts'])}); recoveries "
            f"{'within' if s['within_tolerance'] else 'OUTSIDE'} {TOLERANCE:.0%} of x1"
        )
    outputs.write_json(args.results, "timing", {"cells": rows, "summary": summary})
    with outputs.figure(args.results, "timing", ncols=2) as (scale_ax, lag_ax):
        labels = [
            f"{r['scenario'][:10]} x{r['time_scale']:g}{'h' if r['hog'] else ''}" for r in rows
        ]
        outputs.bars(
            scale_ax,
            labels,
            {"achieved": [r["achieved_scale"] or 0 for r in rows]},
            ylabel="emulated s per wall s",
            title="time scale achieved",
            log=True,
        )
        outputs.bars(
            lag_ax,
            labels,
            {"worst lag": [r["worst_lag_emulated_s"] or 0 for r in rows]},
            ylabel="emulated s",
            title="worst lateness reported",
        )
        for ax in (scale_ax, lag_ax):
            ax.tick_params(axis="x", labelrotation=70, labelsize=6)
    outputs.announce(args.results, "timing")


if __name__ == "__main__":
    main()
