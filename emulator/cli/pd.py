"""`cmemu simulate pd`: dynamic PD in model mode (emulator/model/serving/pd.py). Reads the files,
builds the typed options, prints the P:D split over time, the switches and goodput."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cmemu.emulator.cli.argtypes import seconds
from cmemu.emulator.model.serving.pd import PdResult, run_pd
from cmemu.emulator.model.serving.pdpolicy import POLICIES, PdOptions


def pd_args(sub: Any) -> None:
    from cmemu.emulator.cli.simulate import set_option  # simulate imports this module

    p = sub.add_parser(
        "pd",
        help="dynamic PD: units moved between prefill and decode as the mix shifts, goodput",
        description="The deployment's NPUs as units of one prefill instance each; a policy "
        "gives each unit the prefill or the decode role as the prompt/output mix and the load "
        "change (a role change reloads the weights from EMS). Prints the P:D split over time, "
        "every switch and goodput (model mode).",
    )
    p.add_argument("--deployment", required=True, help="deployment YAML file")
    p.add_argument("--workload", required=True, help="workload YAML file (phases: a shifting mix)")
    p.add_argument(
        "--pd", choices=list(POLICIES), default="dynamic", help="the policy (default: dynamic)"
    )
    p.add_argument(
        "--prefill-units",
        type=int,
        default=0,
        help="units in the prefill role at the start (default: the deployment's share)",
    )
    p.add_argument("--interval", type=seconds, default=30.0, help="between decisions (30s)")
    p.add_argument("--window", type=seconds, default=120.0, help="demand measured over (2m)")
    p.add_argument("--horizon", type=seconds, default=1800.0, help="a switch must pay within (30m)")
    p.add_argument("--headroom", type=float, default=0.2, help="capacity above demand (0.2)")
    p.add_argument("--duration", type=seconds, help="emulated time (default: the workload's)")
    p.add_argument("--seed", type=int, help="the workload's seed (default: its own)")
    set_option(p)
    p.add_argument("--json", action="store_true", help="one JSON object")


def cmd_pd(args: argparse.Namespace) -> int:
    from cmemu.emulator.cli.simulate import _requests, deployment_and_profile  # the shared readers

    deployment, profile = deployment_and_profile(args)
    requests, duration = _requests(args, profile)
    options = PdOptions(
        policy=args.pd,
        prefill_units=args.prefill_units,
        interval_s=args.interval,
        window_s=args.window,
        horizon_s=args.horizon,
        headroom=args.headroom,
    )
    end = duration if duration is not None else max((r.arrival_s for r in requests), default=0)
    result = run_pd(deployment, requests, options, duration_s=end, profile=profile)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    _print(result)
    return 0


def _print(r: PdResult) -> None:
    print(
        f"{r.units} units of {r.unit_npus} NPUs, policy {r.policy}; a role change reloads the "
        f"weights from EMS in {r.load_s:g} s"
    )
    print(f"{'TIME':>8}  {'P:D':>5}  {'SWITCHING':>9}  PREFILL SHARE OF DEMAND")
    last = None
    for s in r.trace:
        row = (s.prefill, s.decode, s.switching)
        if row == last and s is not r.trace[-1]:
            continue
        last = row
        print(
            f"{s.at_s:8.0f}  {s.prefill:>2}:{s.decode:<2}  {s.switching:>9}  {s.prefill_share:.0%}"
        )
    for w in r.switches:
        ready = f"ready at {w.ready_s:.0f} s" if w.ready_s else "still switching at the end"
        print(f"switch at {w.at_s:.0f} s: {w.units} unit(s) to {w.to}, {ready}")
    print(
        f"goodput {r.goodput_per_s:.2f} req/s ({r.goodput_tokens_per_s:,.0f} output tokens/s), "
        f"SLO attainment {r.slo_attainment:.1%} of {r.submitted} requests, "
        f"{len(r.switches)} switches"
    )
