"""Every shipped cm-mini scenario, seeds x runs (issue 20: "every scenario in scenarios/ passes
end to end at its declared time scale, 3 runs of 3 seeds each"); none declares one, so they run
at x50, as the suite runs them.

Each run is a fresh `cmemu up` of the scenario's preset beside its own MQTT broker (a scenario's
faults can leave NPUs held back, which would change the next one's placement), the scenario run
against it as `cmemu chaos run --seed` runs it (the suite runs each once: test_shipped.py; a
`--time-scale` overrides the x50). Seeds are
the scenario's own seed, then +1, +2, ...; a seed changes the jitter of its steps and the
workloads' traffic. The container scenarios need the Docker engine (tests/runtime/
test_docker_engine.py), cm384's mixed-storm is bench/chaos.py's.

    python bench/scenarios.py [--seeds 3] [--runs 3] [--time-scale X] [--only NAME,...]

Prints one line per run (verdict, wall time, the worst recovery) and a table per scenario;
writes bench/results/scenarios.json and .png. Exit 1 when any run did not pass.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.pytest_plugin import start_supernode
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
START_ATTEMPTS = 3
UNDECLARED_SCALE = 50.0  # a scenario that declares none runs as the suite runs it (test_shipped.py)
ELSEWHERE = ("container-", "mixed-storm")  # the engine test's; bench/chaos.py's


@dataclass(frozen=True, kw_only=True)
class Run:
    scenario: str
    seed: int
    run: int
    outcome: str
    wall_s: float
    worst_recovery_s: float | None
    failed: tuple[str, ...]  # the expectations that did not hold, with their reasons


def shipped(only: list[str]) -> list[Path] | str:
    """The scenarios to run, or what is wrong with `only`."""
    paths = sorted(p for p in SCENARIOS.glob("*.yaml") if not p.name.startswith(ELSEWHERE))
    unknown = set(only) - {p.stem for p in paths}
    if unknown:
        known = ", ".join(p.stem for p in paths)
        return f"unknown scenario(s) {', '.join(sorted(unknown))}: one of {known}"
    return [p for p in paths if p.stem in only] if only else paths


def run_once(path: Path, seed: int, k: int, time_scale: float | None) -> Run:
    scenario = files.load(path)
    scale = time_scale or scenario.time_scale or UNDECLARED_SCALE
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cmemu-scenarios-") as directory:
        for attempt in range(START_ATTEMPTS):
            try:
                sn = start_supernode(
                    preset=scenario.preset or "cm-mini", mode="inprocess", time_scale=scale,
                    directory=Path(directory), broker=True,
                )  # fmt: skip
                break
            except RuntimeError as exc:  # no emulator: the run judged nothing, said with its log
                logs = "".join(
                    p.read_text(errors="replace")[-2000:] for p in Path(directory).glob("*.log")
                )
                # another process on this machine bound a port between the free-port search
                # and the bind: a fresh search finds others
                if "ADDRESS_IN_USE" in logs and attempt + 1 < START_ATTEMPTS:
                    continue
                print(f"{path.stem} seed {seed}: {exc}\n{logs}", flush=True)
                return Run(
                    scenario=path.stem, seed=seed, run=k, outcome="NOT STARTED",
                    wall_s=time.perf_counter() - started, worst_recovery_s=None,
                    failed=(str(exc),),
                )  # fmt: skip
        try:

            async def run(clients: Clients) -> RunResult:
                return await run_scenario(clients, scenario, RunOptions(seed=seed))

            result = sn.call(run)
        finally:
            sn.stop()
    recoveries = [r.recovery_s for r in result.recoveries if r.recovery_s is not None]
    failed = tuple(f"{c.name}: {c.detail}" for c in result.verdict.checks if not c.ok)
    out = Run(
        scenario=path.stem, seed=seed, run=k, outcome=result.outcome,
        wall_s=time.perf_counter() - started,
        worst_recovery_s=max(recoveries) if recoveries else None, failed=failed,
    )  # fmt: skip
    if not result.ok:
        print("\n".join(summary_lines(result)), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per scenario (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="runs per seed (default 3)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="override every scenario's time scale")  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.seeds < 1 or args.runs < 1:
        parser.error("--seeds and --runs are at least 1")
    if args.time_scale is not None and args.time_scale <= 0:
        parser.error("--time-scale is > 0")
    paths = shipped([n for n in args.only.split(",") if n])
    if isinstance(paths, str):
        parser.error(paths)
    runs: list[Run] = []
    for path in paths:
        base = files.load(path).seed
        for s in range(args.seeds):
            for k in range(args.runs):
                r = run_once(path, base + s, k, args.time_scale)
                runs.append(r)
                shown = "-" if r.worst_recovery_s is None else f"{r.worst_recovery_s:.1f} s"
                why = f"  FAILED: {'; '.join(r.failed)}" if r.failed else ""
                line = f"{r.scenario:<26} seed {r.seed:<5} run {k}  {r.outcome:<7} "
                print(f"{line}wall {r.wall_s:6.1f} s  worst recovery {shown}{why}", flush=True)
    names = sorted({r.scenario for r in runs})
    print(f"\n{'SCENARIO':<26} {'PASSED':>7} {'OF':>3}  WORST RECOVERY (emulated)")
    for name in names:
        mine = [r for r in runs if r.scenario == name]
        passed = sum(r.outcome == "PASS" for r in mine)
        worst = [r.worst_recovery_s for r in mine if r.worst_recovery_s is not None]
        print(f"{name:<26} {passed:>7} {len(mine):>3}  "
              + (f"{max(worst):.1f} s" if worst else "-"))  # fmt: skip
    doc = {"seeds": args.seeds, "runs": args.runs, "time_scale": args.time_scale, "results": runs}
    outputs.write_json(args.results, "scenarios", doc)
    with outputs.figure(args.results, "scenarios", size=(9.0, 4.5)) as (ax,):
        outputs.bars(
            ax, names,
            {"passed": [sum(r.outcome == "PASS" for r in runs if r.scenario == n) for n in names],
             "runs": [sum(r.scenario == n for r in runs) for n in names]},
            ylabel="runs", title="shipped scenarios: runs passed",
        )  # fmt: skip
    outputs.announce(args.results, "scenarios")
    return 0 if all(r.outcome == "PASS" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
