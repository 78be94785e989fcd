"""`cmemu chaos run FILE` and `cmemu chaos ls`: parsing and printing over emulator/runtime/chaos/.

`run` exits 0 only when every expectation holds, 1 when one fails (or the emulator reports an
error), 2 on a bad scenario file (its YAML path in the message), 3 when the run did not keep
pace (ABORTED: a process stopped answering, or the lag was unbounded; its verdict would say how
busy the host was)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from cmemu.emulator.cli import argtypes
from cmemu.emulator.cli.argtypes import UsageError
from cmemu.emulator.model.chaos.pace import ABORTED
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.timeline import Entry
from cmemu.emulator.model.chaos.units import format_s
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.chaos import files, kinds
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario
from cmemu.emulator.runtime.chaos.schedule import Schedule, ScheduledRun, outcome, run_schedule

FAILED = 1
ABORTED_EXIT = 3


def format_entry(e: Entry) -> str:
    return f"  t+{format_s(e.since_start_s):>8}  {e.phase:<13} {e.subject:<20} {e.detail}".rstrip()


def summary_lines(result: RunResult) -> list[str]:
    out = ["recoveries (emulated, from injection):"]
    for r in result.recoveries:
        i = r.injection
        ttr = r.status if r.recovery_s is None else format_s(r.recovery_s)
        slo = f", SLO back {format_s(r.slo_back_s)}" if r.slo_back_s is not None else ""
        what = f"affected {','.join(r.workloads)}" if r.workloads else "no workload affected"
        out.append(f"  {i.label:<16} {i.kind:<14} {i.target:<22} {ttr}{slo} ({what})")
        out.append(f"  {'':<16} {r.phases()}")
    out.append("expectations:")
    for c in result.verdict.checks:
        mark = "PASS" if c.ok else "FAIL"
        line = f"  {mark} {c.name}: expected {c.expected}; measured {c.measured}"
        out.append(line + (f" ({c.detail})" if c.detail else ""))
    for note in result.notes:
        out.append(f"note: {note}")
    if result.pace is not None:
        out.append(f"pace: {result.pace.line()}")
        if result.pace.aborted:
            out.append(f"aborted: {result.pace.aborted}")
    out.append(
        f"{result.outcome}: scenario {result.scenario.name} (seed {result.seed}) in "
        f"{result.wall_s:.1f} s wall at time scale {result.time_scale:g} (workloads' start "
        f"{result.setup_wall_s:.1f} s, scenario {result.scenario_wall_s:.1f} s)"
    )
    return out


def to_json(result: RunResult) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name,
        "seed": result.seed,
        "ok": result.ok,
        "outcome": result.outcome,
        "pace": asdict(result.pace) if result.pace is not None else None,
        "aborted": result.pace.aborted if result.pace is not None else "",
        "wall_s": result.wall_s,
        "setup_wall_s": result.setup_wall_s,
        "scenario_wall_s": result.scenario_wall_s,
        "time_scale": result.time_scale,
        "checks": [asdict(c) for c in result.verdict.checks],
        "recoveries": [
            {
                "step": r.injection.label,
                "kind": r.injection.kind,
                "target": r.injection.target,
                "fault_ns": r.injection.at_ns,
                "detected_ns": r.detected_ns,
                "isolated_ns": r.isolated_ns,
                "replaced_ns": r.replaced_ns,
                "restored_ns": r.restored_ns,
                "recovery_s": r.recovery_s,
                "slo_back_s": r.slo_back_s,
                "status": r.status,
                "tolerated": r.tolerated,
                "workloads": list(r.workloads),
                "incidents": [i.id for i in r.incidents],
            }
            for r in result.recoveries
        ],
        "timeline": [asdict(e) for e in result.timeline],
        "notes": result.notes,
    }


def junit_xml(*results: RunResult) -> bytes:
    """One test case per expectation, in a suite named after the scenario (one suite per run of
    a schedule, `chaos.NAME.run2` from the second on)."""
    suites = ET.Element("testsuites")
    for i, result in enumerate(results):
        checks = result.verdict.checks
        name = f"chaos.{result.scenario.name}" + (f".run{i + 1}" if i else "")
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=name,
            tests=str(len(checks)),
            failures=str(sum(not c.ok for c in checks)),
            time=f"{result.wall_s:.3f}",
        )
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=name, name=c.name)
            if not c.ok:
                failure = ET.SubElement(case, "failure", message=f"measured {c.measured}")
                failure.text = f"expected {c.expected}; measured {c.measured}\n{c.detail}".rstrip()
    xml: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return xml


def _live(args: argparse.Namespace) -> Callable[[Entry], None]:
    """The timeline as it happens, unless the output is one JSON document."""

    def live(entry: Entry) -> None:
        if not args.json:
            print(format_entry(entry), flush=True)

    return live


def _run(args: argparse.Namespace) -> int:
    try:
        scenario = files.load(files.find(args.file))
        schedule = Schedule(repeat=args.repeat, every_s=args.every)
        schedule.check()
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from exc
    if args.keep and schedule.repeat > 1:
        raise UsageError("--keep leaves one run's workloads running: not with --repeat")
    if schedule.repeat > 1:
        return _scheduled(args, scenario, schedule)
    path = state.path_from(args.state_file)
    state.read(path)  # no running emulator: say so before anything starts

    live = _live(args)

    async def go() -> RunResult:
        clients = await asyncio.to_thread(state.fault_clients, path)
        try:
            options = RunOptions(
                seed=args.seed, keep=args.keep, time_scale=args.time_scale, warm=args.warm
            )
            return await run_scenario(clients, scenario, options, on_entry=live)
        finally:
            await clients.close()

    if not args.json:
        print(f"scenario {scenario.name}: {len(scenario.steps)} steps; timeline (emulated, "
              "from the workloads being up):", flush=True)  # fmt: skip
    result = asyncio.run(go())
    if args.junit:
        Path(args.junit).write_bytes(junit_xml(result))
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        print("\n".join(summary_lines(result)))
    if result.outcome == ABORTED:
        return ABORTED_EXIT
    return 0 if result.ok else FAILED


def _scheduled(args: argparse.Namespace, scenario: Scenario, schedule: Schedule) -> int:
    """--repeat N [--every DURATION]: the runs in turn, each judged, then one line per run."""
    path = state.path_from(args.state_file)
    state.read(path)

    live = _live(args)

    def started(index: int, seed: int, late_s: float) -> None:
        if not args.json:
            late = f"; {format_s(late_s)} late: the run before lasted longer" if late_s else ""
            print(f"run {index + 1}/{schedule.repeat} of scenario {scenario.name} (seed {seed})"
                  f"{late}", flush=True)  # fmt: skip

    async def go() -> list[ScheduledRun]:
        clients = await asyncio.to_thread(state.fault_clients, path)
        try:
            options = RunOptions(seed=args.seed, time_scale=args.time_scale, warm=args.warm)
            return await run_schedule(clients, scenario, options, schedule, on_entry=live,
                                      on_start=started)  # fmt: skip
        finally:
            await clients.close()

    runs = asyncio.run(go())
    if args.junit:
        Path(args.junit).write_bytes(junit_xml(*(r.result for r in runs)))
    if args.json:
        doc = [
            {"run": r.index + 1, "started_s": r.started_s - runs[0].planned_s,
             "late_s": r.late_s, **to_json(r.result)}
            for r in runs
        ]  # fmt: skip
        print(json.dumps({"ok": outcome(runs) == "ok", "runs": doc}, indent=2))
    else:
        for r in runs:
            print("\n".join(summary_lines(r.result)))
        print(f"schedule of {scenario.name}: {sum(r.result.ok for r in runs)} of {len(runs)} "
              "runs passed")  # fmt: skip
        for r in runs:
            worst = max((x.recovery_s or 0.0 for x in r.result.recoveries), default=0.0)
            print(f"  run {r.index + 1}  seed {r.seed:<6} {r.result.outcome:<8} "
                  f"started +{format_s(r.started_s - runs[0].planned_s)}  "
                  f"worst recovery {format_s(worst)}")  # fmt: skip
    verdict = outcome(runs)
    return 0 if verdict == "ok" else ABORTED_EXIT if verdict == ABORTED else FAILED


def _ls(args: argparse.Namespace) -> int:
    rows_kinds = [{"kind": name, "help": kinds.help_of(name)} for name in sorted(kinds.checkers())]
    rows_scenarios: list[dict[str, str]] = []
    for p in files.library():
        try:
            sc = files.load(p)
            rows_scenarios.append({"scenario": sc.name, "file": str(p), "about": sc.description})
        except Exception as exc:  # a broken file is listed as such, never hides the others
            rows_scenarios.append({"scenario": p.stem, "file": str(p), "about": f"BROKEN: {exc}"})
    if args.json:
        print(json.dumps({"kinds": rows_kinds, "scenarios": rows_scenarios}, indent=2))
        return 0
    print("fault kinds:")
    for k in rows_kinds:
        print(f"  {k['kind']:<16} {k['help']}")
    print("scenarios (cmemu chaos run NAME|FILE):")
    for s in rows_scenarios:
        print(f"  {s['scenario']:<26} {s['about'].splitlines()[0] if s['about'] else ''}")
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {"run": _run, "ls": _ls}


def cmd_chaos(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](args)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is an integer >= 0, got {text!r}")
    return value


def chaos_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = sub.add_parser(
        "run",
        help="run a scenario against the running emulator and judge it",
        description="Start the scenario's workloads, inject its faults on the emulated "
        "schedule, print the timeline, and exit 0 only when every expectation holds.",
    )
    run.add_argument("file", metavar="FILE", help="a scenario file, or a name from `chaos ls`")
    run.add_argument("--seed", type=_seed, help="override the scenario's seed")
    run.add_argument("--junit", metavar="OUT.xml", help="write one test case per expectation")
    run.add_argument("--json", action="store_true", help="print the result as one JSON document")
    run.add_argument("--keep", action="store_true", help="leave the workloads running at the end")
    run.add_argument(
        "--time-scale",
        type=argtypes.positive_float,
        metavar="X",
        help="run the steps and traffic at this time scale (at most the emulator's; overrides "
        "the scenario's `time_scale`); the set-up, such as weights loading, runs at the "
        "emulator's own",
    )
    run.add_argument(
        "--warm",
        action="store_true",
        help="start the scenario's deployments warm (weights already in EMS, as serve-model "
        "--warm): a shorter set-up",
    )
    run.add_argument(
        "--repeat",
        type=argtypes.positive_int,
        default=1,
        metavar="N",
        help="run the scenario N times, the seed one higher each run; exit 0 only when every "
        "run passes",
    )
    run.add_argument(
        "--every",
        type=argtypes.seconds,
        metavar="DURATION",
        help="with --repeat: start each run this much emulated time after the one before "
        "started (`1h`); a run that lasts longer delays the next, never overlaps it",
    )
    add_state(run)
    ls = sub.add_parser("ls", help="the fault kinds and the scenarios of the library")
    ls.add_argument("--json", action="store_true", help="one JSON document")
