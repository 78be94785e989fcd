"""Dynamic PD against every fixed split, model mode (issue 24 item 4; emulator/model/serving/pd.py):
DeepSeek-R1 on 64 NPUs of cm384 as four units of 16 (examples/deployments/pd-64.yaml) under a
mix that shifts every 30 minutes between long prompts with short answers and short prompts with
long answers (examples/workloads/shifting-mix.yaml). For the dynamic policy and each fixed split:
goodput (requests meeting TTFT 2 s and TPOT 50 ms, per second), SLO attainment, switches; and the
dynamic split over time beside the mix it follows. Writes pd.json and pd.png.

    python bench/pd.py [--seconds 7200] [--results DIR]   (about 4 s of CPU per hour emulated)
    python bench/pd.py --live                             (and the live router: bench/pd_live.py)

`--live` adds the live half: dynamic against fixed splits on an in-process cm-mini's router, the
same policy moving real instances (bench/pd_live.py says how; a few minutes of wall time).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.pd import PdResult, run_pd
from cmemu.emulator.model.serving.pdpolicy import PdOptions, unit_rates
from cmemu.emulator.model.serving.workload import generate, parse_workload

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

try:
    from bench import pd_live
except ModuleNotFoundError:
    import pd_live  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = ROOT / "examples/deployments/pd-64.yaml"
WORKLOAD = ROOT / "examples/workloads/shifting-mix.yaml"


def run(seconds: float) -> dict[str, PdResult]:
    deployment = parse_deployment(yaml.safe_load(DEPLOYMENT.read_text()))
    workload = parse_workload(yaml.safe_load(WORKLOAD.read_text()))
    requests = list(generate(workload, block_tokens=512, duration_s=seconds))
    units = deployment.npus // deployment.prefill.npus
    runs = {"dynamic": PdOptions()}
    runs |= {
        f"fixed {p}:{units - p}": PdOptions(policy="fixed", prefill_units=p)
        for p in range(1, units)
    }
    rates = unit_rates(deployment)  # the cost model's figures, once for every run
    return {
        name: run_pd(deployment, requests, options, duration_s=seconds, rates=rates)
        for name, options in runs.items()
    }


def report(results: dict[str, PdResult]) -> None:
    for name, r in results.items():
        print(
            f"{name:<10} goodput {r.goodput_per_s:5.2f} req/s ({r.goodput_tokens_per_s:6,.0f} "
            f"tokens/s), SLO attainment {r.slo_attainment:6.1%}, {len(r.switches)} switches"
        )
    for s in results["dynamic"].switches:
        print(f"    {s.at_s:6.0f} s: {s.units} unit to {s.to}, ready at {s.ready_s:.0f} s")


def plot(results: dict[str, PdResult], directory: Path) -> None:
    dynamic = results["dynamic"]
    with outputs.figure(directory, "pd", ncols=2, title="dynamic PD, 4 units of 16 NPUs") as axes:
        trace = dynamic.trace
        outputs.over_time(
            axes[0],
            [s.at_s / 60 for s in trace],
            {
                "prefill units": [s.prefill for s in trace],
                "decode units": [s.decode for s in trace],
                "prefill share of demand x4": [4 * s.prefill_share for s in trace],
            },
            xlabel="minute",
            title="the split follows the mix",
        )
        outputs.bars(
            axes[1],
            list(results),
            {"goodput": [r.goodput_per_s for r in results.values()]},
            ylabel="goodput (req/s meeting TTFT and TPOT)",
            title="dynamic against every fixed split",
            value_format="%.2f",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=7200.0, help="emulated seconds")
    parser.add_argument(
        "--live", action="store_true", help="also dynamic against fixed on the live router"
    )
    parser.add_argument(
        "--live-cycles", type=int, default=1, help="times the live mix repeats (default 1)"
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if not args.seconds > 0:
        parser.error("--seconds must be positive")
    if args.live_cycles < 1:
        parser.error("--live-cycles must be >= 1")
    started = time.process_time()
    results = run(args.seconds)
    cpu_s = time.process_time() - started
    report(results)
    print(f"cpu_s {cpu_s:.1f}")
    doc: dict[str, object] = {"seconds": args.seconds, "cpu_s": cpu_s}
    doc |= {name: r.to_dict() for name, r in results.items()}
    if args.live:
        runs = pd_live.live(args.live_cycles)
        pd_live.report_live(runs)
        doc["live"] = {name: r.to_dict() for name, r in runs.items()}
    outputs.write_json(args.results, "pd", doc)
    plot(results, args.results)
    outputs.announce(args.results, "pd")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
