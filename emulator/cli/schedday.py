"""`cmemu sched day start|status|stop`: serve by day, train by night on the running emulator
(the scheduler's day plan, emulator/engines/dayplan.py). Parsing and printing only: every
decision (and every refusal) is the scheduler's."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from cmemu.emulator.cli.argtypes import (
    non_negative_int,
    non_negative_seconds,
    positive_float,
    positive_int,
)
from cmemu.emulator.cli.output import wire_dict
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.dayplan import DayPlan, day_plan, start_day_plan, stop_day_plan
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.runtime import state

NS = 1e9


async def _with_clients(args: argparse.Namespace, call: Callable[[Clients], Awaitable[Any]]) -> Any:
    clients = state.clients(state.path_from(args.state_file))
    try:
        return await call(clients)
    finally:
        await clients.close()


def _run(args: argparse.Namespace, call: Callable[[Clients], Awaitable[Any]]) -> Any:
    return asyncio.run(_with_clients(args, call))


def _start(args: argparse.Namespace) -> int:
    job = TrainingSpec(
        name=args.job,
        npus=args.job_npus,
        model=args.model or "",
        checkpoint_every=args.checkpoint_every,
    )
    plan: DayPlan = _run(
        args,
        lambda c: start_day_plan(
            c,
            deployment=args.deployment,
            job=job,
            night=args.night,
            hour_s=args.hour_s,
            start_hour=args.start_hour,
            hours=args.hours,
            night_decode_npus=args.night_decode_npus,
            drain_s=args.drain,
            name=args.plan or "",
        ),
    )
    if args.json:
        print(json.dumps(_doc(plan), indent=2))
        return 0
    footprint = f"{plan.night_decode_npus} decode NPUs" if plan.night_decode_npus else "undeployed"
    print(
        f"day plan {plan.name}: {plan.deployment} by day, {footprint} and job "
        f"{plan.training_job} at night ({plan.night}); one plan hour = {plan.hour_s:g} emulated s"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    plan: DayPlan = _run(args, lambda c: day_plan(c, args.plan))
    _print(plan, as_json=args.json)
    return 0


def _stop(args: argparse.Namespace) -> int:
    plan: DayPlan = _run(args, lambda c: stop_day_plan(c, args.plan))
    print(f"day plan {plan.name}: stopping ({plan.state} now; at night serving comes back first)")
    return 0


def _doc(plan: DayPlan) -> dict[str, Any]:
    """The plan as cmemu.v1.DayPlan's JSON spells it, every field shown."""
    switches = [
        wire_dict(
            [
                ("at_ns", s.at_ns, "int64"),
                ("plan_hour", s.plan_hour),
                ("to", s.to),
                ("duration_ns", s.duration_ns, "int64"),
                ("npus", s.npus),
            ],
            defaults=True,
        )
        for s in plan.switches
    ]
    periods = [
        wire_dict(
            [
                ("kind", p.kind),
                ("start_ns", p.start_ns, "int64"),
                ("end_ns", p.end_ns, "int64"),
                ("served_tokens", p.served_tokens, "int64"),
                ("training_steps", p.training_steps, "int64"),
            ],
            defaults=True,
        )
        for p in plan.periods
    ]
    return wire_dict(
        [
            ("name", plan.name),
            ("deployment", plan.deployment),
            ("training_job", plan.training_job),
            ("night", plan.night),
            ("hour_s", plan.hour_s),
            ("start_hour", plan.start_hour),
            ("hours", plan.hours),
            ("state", plan.state),
            ("plan_hour", plan.plan_hour),
            ("switches", switches),
            ("periods", periods),
            ("served_tokens_day", plan.served_tokens_day, "int64"),
            ("served_tokens_night", plan.served_tokens_night, "int64"),
            ("training_steps", plan.training_steps, "int64"),
            ("training_step", plan.training_step, "int64"),
            ("started_ns", plan.started_ns, "int64"),
            ("error", plan.error),
            ("night_decode_npus", plan.night_decode_npus),
            ("drain_s", plan.drain_s),
        ],
        defaults=True,
    )


def _print(plan: DayPlan, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_doc(plan), indent=2))
        return
    print(
        f"day plan {plan.name}: {plan.state} at plan hour {plan.plan_hour:.2f} "
        f"(night {plan.night}, {plan.hour_s:g} emulated s per hour)"
    )
    print(f"{'SWITCH AT':>12} {'PLAN HOUR':>9}  {'TO':<9} {'NPUS':>4} {'TOOK':>10}")
    for s in plan.switches:
        print(
            f"{s.at_ns / NS:>10.1f} s {s.plan_hour:>9.2f}  {s.to:<9} {s.npus:>4} "
            f"{s.duration_ns / NS:>8.1f} s"
        )
    print(f"{'PERIOD':<6} {'FROM':>10} {'TO':>10} {'TOKENS':>10} {'STEPS':>6}")
    for p in plan.periods:
        end = f"{p.end_ns / NS:.1f} s" if p.end_ns else "now"
        print(
            f"{p.kind:<6} {p.start_ns / NS:>8.1f} s {end:>10} {p.served_tokens:>10} "
            f"{p.training_steps:>6}"
        )
    print(
        f"tokens served by day {plan.served_tokens_day}, by night {plan.served_tokens_night}; "
        f"training steps at night {plan.training_steps} (job {plan.training_job} at step "
        f"{plan.training_step})"
    )
    if plan.error:
        print(f"error: {plan.error}")


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "start": _start,
    "status": _status,
    "stop": _stop,
}


def day_args(sub: Any, add_state: Callable[[argparse.ArgumentParser], None]) -> None:
    day = sub.add_parser(
        "day", help="serve by day, train by night: a day plan on a compressed clock"
    )
    actions = day.add_subparsers(dest="day_action", required=True, metavar="DAY_ACTION")
    start = actions.add_parser(
        "start",
        help="shrink a deployment at nightfall and train on the freed NPUs until morning",
    )
    start.add_argument("deployment", help="a deployment of the router (cmemu deployments)")
    start.add_argument("--job", required=True, help="the training job's name")
    start.add_argument("--job-npus", type=positive_int, required=True, help="its NPUs")
    start.add_argument("--model", help="the job's model (default: the catalogue's default)")
    start.add_argument(
        "--checkpoint-every", type=non_negative_int, default=0, help="steps (0: the profile's)"
    )
    start.add_argument(
        "--night-decode-npus",
        type=non_negative_int,
        default=0,
        help="the deployment's decode NPUs at night (default 0: undeployed at night)",
    )
    start.add_argument(
        "--drain",
        type=non_negative_seconds,
        default=0.0,
        help="emulated time a footprint about to go may take to finish its requests in flight "
        "(default 0: they end with it)",
    )
    start.add_argument("--night", default="22-7", help="plan hours START-END (default 22-7)")
    start.add_argument(
        "--hour-s",
        type=positive_float,
        default=60.0,
        help="emulated seconds per plan hour (default 60: a day in 24 emulated minutes)",
    )
    start.add_argument(
        "--start-hour", type=float, default=0.0, help="the plan clock's hour at the start"
    )
    start.add_argument(
        "--hours", type=float, default=0.0, help="plan hours to run (default 0: until stopped)"
    )
    start.add_argument("--plan", help="the plan's name (default: the deployment's)")
    start.add_argument("--json", action="store_true")
    status = actions.add_parser(
        "status", help="a plan's switches (when, which way, how long) and its periods"
    )
    status.add_argument("plan")
    status.add_argument("--json", action="store_true")
    stop = actions.add_parser("stop", help="end a plan (at night, serving comes back first)")
    stop.add_argument("plan")
    for action in (start, status, stop):
        add_state(action)


def cmd_day(args: argparse.Namespace) -> int:
    return ACTIONS[args.day_action](args)
