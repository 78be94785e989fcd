"""`cmemu simulate serving|calibrate|training|scaleout|day|pd`: model mode. The serving engine
in the discrete-event simulator (emulator/model/serving/des.py), no services: hours of emulated
traffic in seconds; a training run's failures; the linearity of training over N supernodes;
dynamic PD (cli/pd.py). This module only reads the files and prints."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from cmemu.emulator.cli.argtypes import UsageError, seconds
from cmemu.emulator.cli.output import Column, print_rows
from cmemu.emulator.cli.pd import cmd_pd, pd_args
from cmemu.emulator.cli.train import simulate_training_cmd, training_args
from cmemu.emulator.model.dayplan import (
    POLICIES,
    DayParams,
    DayResult,
    params_for,
    simulate_day,
)
from cmemu.emulator.model.daywindow import parse_window
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.overrides import apply_overrides, parse_override
from cmemu.emulator.model.serving import calibrate
from cmemu.emulator.model.serving.deployment import (
    Deployment,
    check_deployment,
    parse_deployment,
    profile_of,
)
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.hbm import check_deployment_fits
from cmemu.emulator.model.serving.operating import OperatingPoint, operating_point
from cmemu.emulator.model.serving.report import Report
from cmemu.emulator.model.serving.workload import generate, parse_workload, read_mooncake
from cmemu.emulator.model.training.scaleout import (
    CROSS_ALGORITHMS,
    preset_supernodes,
    scaleout_step,
    supernode_step,
    with_oversubscription,
)

# the multi-turn trace the repository ships (workloads/README.md): calibrate's default
MOONCAKE = Path(__file__).resolve().parents[2] / "workloads" / "mooncake-synthetic.jsonl"


def simulate_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="simulate_command", required=True, metavar="WHAT")
    serving = sub.add_parser(
        "serving",
        help="a serving deployment under a workload, in the discrete-event simulator",
        description="Run a workload through the serving engine on the cost model (no gRPC): "
        "TTFT and TPOT percentiles, tokens/s per NPU, batch sizes, KV hit rate, EMS traffic.",
    )
    serving.add_argument("--deployment", required=True, help="deployment YAML file")
    serving.add_argument(
        "--workload",
        required=True,
        help="workload YAML file (distributions), or a Mooncake trace (.jsonl)",
    )
    serving.add_argument(
        "--duration",
        type=seconds,
        help="emulated time to run, e.g. 600, 10m, 1h (default: the workload's duration; a "
        "trace: to the end)",
    )
    serving.add_argument("--seed", type=int, help="the workload's seed (default: its own)")
    set_option(serving)
    serving.add_argument(
        "--slo-tpot",
        type=seconds,
        metavar="DURATION",
        help="find the largest decode batch per die (within the HBM bound) whose TPOT meets "
        "this target (e.g. 50ms) at the workload's mean lengths, print that operating point "
        "and run the workload at it",
    )
    serving.add_argument("--json", action="store_true", help="the report as one JSON object")
    cal = sub.add_parser(
        "calibrate",
        help="the serving cost model against the published serving points, with its error",
    )
    cal.add_argument(
        "--trace",
        metavar="FILE",
        default=str(MOONCAKE),
        help="a multi-turn trace (Mooncake format) for the multi-turn TTFT gain; default: the "
        "repository's workloads/mooncake-synthetic.jsonl; 'none' leaves the point out",
    )
    cal.add_argument("--json", action="store_true", help="one JSON array")
    training_args(sub)
    scaleout_args(sub)
    day_args(sub)
    pd_args(sub)


def day_args(sub: Any) -> None:
    p = sub.add_parser(
        "day",
        help="one day of serving by day and training by night: tokens served, steps, switches",
        description="A diurnal demand on the supernode: serving at the deployment's SLO "
        "operating point keeps the NPUs the demand needs, a training job takes the rest; "
        "every switch costs its drain, checkpoint, restart and weight load (model mode). "
        "Printed beside serving all day.",
    )
    p.add_argument("--deployment", required=True, help="deployment YAML file")
    p.add_argument("--workload", required=True, help="workload YAML file: the lengths")
    p.add_argument(
        "--peak",
        type=float,
        required=True,
        metavar="TOKENS_PER_S",
        help="output tokens per second wanted at the peak hour",
    )
    p.add_argument("--trough", type=float, default=0.2, help="the trough, a fraction of the peak")
    p.add_argument("--peak-hour", type=float, default=14.0, help="hour of the peak (0-24)")
    p.add_argument("--policy", choices=POLICIES, default="load", help="who decides (default: load)")
    p.add_argument(
        "--night",
        default="22-7",
        metavar="START-END",
        help="the calendar policy's night window, hours (default 22-7)",
    )
    p.add_argument("--headroom", type=float, default=0.2, help="capacity above demand (0.2)")
    p.add_argument(
        "--slo-tpot",
        type=seconds,
        metavar="DURATION",
        help="the TPOT target of the operating point (default: the deployment's)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")


def scaleout_args(sub: Any) -> None:
    p = sub.add_parser(
        "scaleout",
        help="data-parallel training over N supernodes: step time, its phases, linearity",
        description="A job on every NPU of every supernode of a `<base>x<N>` preset: the "
        "supernode's step on the cost model, the gradient all-reduce hierarchical (UB inside, "
        "the RDMA plane across), and the linearity against one supernode (model mode).",
    )
    p.add_argument("--preset", default="cm384x26", help="<base>x<N> (default cm384x26)")
    p.add_argument(
        "--oversubscription",
        type=float,
        default=None,
        help="of the plane's spine -> core tier (default: the profile's, 1 = non-blocking)",
    )
    p.add_argument("--expert-parallel", type=int, default=0, help="EP group size (0: 1)")
    p.add_argument(
        "--algorithm",
        choices=sorted(CROSS_ALGORITHMS),
        default=None,
        help="across supernodes (default: the cheapest for the size, as libraries choose)",
    )
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="all-reduce after the backward pass, not bucket by bucket during it",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")


def _scaleout(args: argparse.Namespace) -> int:
    profile = DEFAULT_PROFILE
    if args.oversubscription is not None:
        profile = with_oversubscription(profile, spine=args.oversubscription)
    spec = preset_supernodes(args.preset, profile)
    base = supernode_step(spec.name, expert_parallel=args.expert_parallel, profile=profile)
    step = scaleout_step(
        base,
        spec.supernodes,
        overlap=not args.no_overlap,
        algorithm=args.algorithm,
        profile=profile,
    )
    doc = {"preset": spec.name, "supernode": base.preset, **dataclasses.asdict(step)}
    doc |= {
        "buckets": base.buckets,
        "bucket_bytes": base.bucket_bytes,
        "expert_parallel": base.expert_parallel,
        "spine_oversubscription": profile.scaleout.spine_oversubscription,
        "overlap": not args.no_overlap,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    ms = {"bucket_s", "reduce_scatter_s", "cross_s", "all_gather_s"}
    width = max(len(k) for k in doc)
    for key, value in doc.items():
        if key in ms:
            shown = f"{float(value) * 1e3:.4g} ms"
        else:
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _yaml(path: str) -> Any:
    try:
        return yaml.safe_load(_read(path))
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{path}: not valid YAML: {exc}") from None


def _requests(
    args: argparse.Namespace, profile: HardwareProfile
) -> tuple[list[Request], float | None]:
    block = profile.serving.block_tokens
    if args.workload.endswith(".jsonl"):
        try:
            trace = read_mooncake(_read(args.workload).splitlines(), block_tokens=block)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{args.workload}: {exc}") from None
        return trace, args.duration
    workload = parse_workload(_yaml(args.workload) or {})
    duration = args.duration if args.duration is not None else workload.duration_s
    requests = list(generate(workload, block_tokens=block, duration_s=duration, seed=args.seed))
    return requests, duration


def _print_report(report: Report) -> None:
    r = report
    rows = [
        ("emulated seconds", f"{r.emulated_s:.1f}"),
        ("requests submitted / finished", f"{r.submitted} / {r.finished}"),
        ("output tokens/s", f"{r.tokens_per_s:,.0f}"),
        ("tokens/s per NPU (all NPUs)", f"{r.tokens_per_s_per_npu:,.1f}"),
        ("decode tokens/s per decode NPU", f"{r.decode_tokens_per_s_per_npu:,.1f}"),
        ("prefill tokens/s per prefill NPU", f"{r.prefill_tokens_per_s_per_npu:,.1f}"),
        (
            "TTFT p50 / p90 / p99 (ms)",
            f"{r.ttft_s.p50 * 1e3:.1f} / {r.ttft_s.p90 * 1e3:.1f} / {r.ttft_s.p99 * 1e3:.1f}",
        ),
        (
            "TPOT p50 / p90 / p99 (ms)",
            f"{r.tpot_s.p50 * 1e3:.2f} / {r.tpot_s.p90 * 1e3:.2f} / {r.tpot_s.p99 * 1e3:.2f}",
        ),
        ("decode batch per die mean / max", f"{r.batch_per_die_mean:.1f} / {r.batch_per_die_max}"),
        ("KV prefix hit rate", f"{r.kv_hit_rate:.1%}"),
        *(
            [("TTFT p50 by turn (ms)", " ".join(f"{t * 1e3:.0f}" for t in r.ttft_p50_s_by_turn))]
            if r.ttft_p50_s_by_turn
            else []
        ),
        ("prefix blocks held in prefill HBM", f"{r.prefill_hbm_hit_blocks:,}"),
        (
            "EMS read / written (GB)",
            f"{r.ems_loaded_bytes / 1e9:.1f} / {r.ems_stored_bytes / 1e9:.1f}",
        ),
        ("prefill -> decode KV (GB)", f"{r.kv_transfer_bytes / 1e9:.1f}"),
        ("SLO attainment / goodput (req/s)", f"{r.slo_attainment:.1%} / {r.goodput_per_s:.2f}"),
    ]
    hbm = (
        f"{r.hbm_batch_per_die} / {r.hbm_peak_bytes_per_die / 1e9:.1f} of "
        f"{r.hbm_bytes_per_die / 1e9:.1f} GB"
    )
    if not r.hbm_weights_fit:
        hbm = "the weights alone overflow a decode die: not enforced (a toy layout)"
    rows.append(("HBM batch per die that fits / peak", hbm))
    if r.hbm_waits or r.hbm_refused:
        rows.append(("waits for HBM / refused", f"{r.hbm_waits} / {r.hbm_refused}"))
    if r.preemptions:
        rows.append(
            ("preempted (recomputed)", f"{r.preemptions} ({r.preempted_tokens:,} tokens again)")
        )
    rows += [(f"override {name}", f"{value:.6g}") for name, value in r.overrides.items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def set_option(parser: Any) -> None:
    """`--set FIGURE=VALUE`, read by `deployment_and_profile`."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIGURE=VALUE",
        help="override a hardware figure for a what-if study (repeatable; names as `cmemu "
        "hardware` lists them, e.g. npu.hbm_bytes_per_s_per_die=3.2e12); after the "
        "deployment file's `hardware` section",
    )


def deployment_and_profile(args: argparse.Namespace) -> tuple[Deployment, HardwareProfile]:
    """`--deployment`'s file, checked against its profile with `--set`'s overrides applied."""
    sets = [parse_override(text) for text in args.set]
    deployment = parse_deployment(_yaml(args.deployment) or {})
    profile = apply_overrides(profile_of(deployment), sets) if sets else profile_of(deployment)
    check_deployment(deployment, profile)
    return deployment, profile


def _serving(args: argparse.Namespace) -> int:
    deployment, profile = deployment_and_profile(args)
    if profile is not DEFAULT_PROFILE:
        check_deployment_fits(deployment, profile)
    requests, duration = _requests(args, profile)
    point = None
    if args.slo_tpot is not None:
        if not requests:
            raise InvalidArgumentError("the workload has no requests to take lengths from")
        point = operating_point(
            deployment,
            args.slo_tpot,
            prompt_tokens=sum(r.input_tokens for r in requests) / len(requests),
            output_tokens=sum(r.output_tokens for r in requests) / len(requests),
            profile=profile,
        )
        decode = dataclasses.replace(
            deployment.decode,
            max_batch_per_die=point.batch_per_die,
            tpot_target_s=args.slo_tpot,
            microbatches=point.microbatches,
        )
        deployment = dataclasses.replace(deployment, decode=decode)
    sim = simulate(deployment, requests, duration_s=duration, profile=profile)
    if args.json:
        doc = sim.report.to_dict()
        if point is not None:
            doc["operating_point"] = dataclasses.asdict(point)
        print(json.dumps(doc, indent=2))
        return 0
    if point is not None:
        _print_point(point)
    _print_report(sim.report)
    return 0


def _print_point(p: OperatingPoint) -> None:
    print(
        f"operating point at TPOT <= {p.target_tpot_s * 1e3:g} ms "
        f"({p.prompt_tokens:,.0f} + {p.output_tokens:,.0f} tokens per request):"
    )
    print(
        f"  batch per die {p.batch_per_die} (HBM bound {p.hbm_batch_per_die}), "
        f"{p.microbatches} microbatch{'es' if p.microbatches > 1 else ''}, "
        f"TPOT {p.tpot_s * 1e3:.2f} ms, {p.tokens_per_s_per_npu:,.0f} decode tokens/s per NPU"
    )
    print("the workload run at that batch:")


def _calibrate(args: argparse.Namespace) -> int:
    trace = None
    if args.trace != "none":
        block = DEFAULT_PROFILE.serving.block_tokens
        lines = _read(args.trace).splitlines()
        try:
            trace = read_mooncake(lines, block_tokens=block)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{args.trace}: {exc}") from None
    rows = [
        {
            "point": p.name,
            "published": "none" if p.published is None else f"{p.published:.4g}",
            "model": f"{p.model:.4g}",
            "unit": p.unit or "-",
            "error": "-" if p.error is None else f"{p.error:+.1%}",
            "tolerance": "-" if p.tolerance is None else f"{p.tolerance:.0%}",
            "fitted": "fit" if p.fitted else "predicted",
        }
        for p in calibrate.points(conversations=trace)
    ]
    columns: list[Column] = [
        ("point", "POINT", "<42"),
        ("published", "PUBLISHED", ">10"),
        ("model", "MODEL", ">10"),
        ("unit", "UNIT", "<8"),
        ("error", "ERROR", ">7"),
        ("tolerance", "TOL", ">4"),
        ("fitted", "", ""),
    ]
    print_rows(rows, columns, as_json=args.json)
    return 0


def _night(text: str) -> tuple[float, float]:
    try:
        return parse_window(text)
    except InvalidArgumentError as exc:
        raise UsageError(f"--night: {exc}") from exc


def _day(args: argparse.Namespace) -> int:
    deployment = parse_deployment(_yaml(args.deployment) or {})
    profile = profile_of(deployment)
    check_deployment(deployment, profile)
    args.duration, args.seed = None, None
    requests, _ = _requests(args, profile)
    if not requests:
        raise InvalidArgumentError("the workload has no requests to take lengths from")
    params = params_for(
        deployment,
        peak_tokens_per_s=args.peak,
        prompt_tokens=sum(r.input_tokens for r in requests) / len(requests),
        output_tokens=sum(r.output_tokens for r in requests) / len(requests),
        target_tpot_s=args.slo_tpot,
        profile=profile,
        trough_fraction=args.trough,
        peak_hour=args.peak_hour,
        policy=args.policy,
        night=_night(args.night),
        headroom=args.headroom,
    )
    day = simulate_day(params, preset=deployment.preset, profile=profile)
    base = simulate_day(dataclasses.replace(params, policy="serve-only"), profile=profile)
    if args.json:
        doc = {"params": dataclasses.asdict(params), "day": day.to_dict()}
        doc["serve_only"] = {k: v for k, v in base.to_dict().items() if k != "hours"}
        print(json.dumps(doc, indent=2))
        return 0
    _print_day(params, day, base)
    return 0


def _print_day(params: DayParams, day: DayResult, base: DayResult) -> None:
    print(
        f"{day.npus} NPUs, {params.tokens_per_s_per_npu:,.0f} output tokens/s per NPU at the "
        f"SLO; demand {params.peak_tokens_per_s * params.trough_fraction:,.0f} to "
        f"{params.peak_tokens_per_s:,.0f} tokens/s (peak at {params.peak_hour:g} h)"
    )
    rows = [
        {
            "hour": f"{h.hour:02d}",
            "demand": f"{h.demand_tokens / 3600:,.0f}",
            "served": f"{h.served_tokens / 3600:,.0f}",
            "serving": f"{h.serving_npus:.0f}",
            "training": f"{h.training_npus:.0f}",
            "switching": f"{h.switching_npus:.0f}",
            "steps": f"{h.training_steps:.1f}",
        }
        for h in day.hours
    ]
    columns: list[Column] = [
        ("hour", "HOUR", "<5"),
        ("demand", "DEMAND/S", ">10"),
        ("served", "SERVED/S", ">10"),
        ("serving", "SERVING", ">8"),
        ("training", "TRAINING", ">9"),
        ("switching", "SWITCHING", ">10"),
        ("steps", "STEPS", ">7"),
    ]
    print_rows(rows, columns, as_json=False)
    for s in day.switches:
        print(
            f"switch at {s.at_s / 3600:05.2f} h: {s.npus} NPUs to {s.to}, "
            f"{s.duration_s:,.0f} s until they work"
        )
    for label, r in ((f"policy {day.policy}", day), ("serving all day", base)):
        print(
            f"{label}: {r.served_tokens:,.0f} of {r.demand_tokens:,.0f} tokens served "
            f"({r.served_fraction:.2%}), {r.training_steps:,.0f} training steps "
            f"({r.training_tokens:,.0f} tokens, {r.training_npu_hours:,.0f} NPU-hours), "
            f"{len(r.switches)} switches"
        )


def cmd_simulate(args: argparse.Namespace) -> int:
    handlers = {
        "serving": _serving,
        "calibrate": _calibrate,
        "training": simulate_training_cmd,
        "scaleout": _scaleout,
        "day": _day,
        "pd": cmd_pd,
    }
    return handlers[args.simulate_command](args)
