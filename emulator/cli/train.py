"""`cmemu train start|ls|get|stop` (cmemu.v1.Training on the manager's server) and
`cmemu simulate training` (model mode: a long run with failures drawn from an MTBF)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import Any

from cmemu.emulator.cli.argtypes import UsageError
from cmemu.emulator.cli.output import Column, print_rows, wire_dict
from cmemu.emulator.client.training import TrainingClient, TrainingJob
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.training.longrun import DAY_S, simulate_training
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.emulator.runtime import state

# --- model mode ----------------------------------------------------------------------------------


def training_args(sub: Any) -> None:
    p = sub.add_parser(
        "training",
        help="a long training run with NPU failures drawn from an MTBF (model mode)",
        description=(
            "A training job's run (the published 40 days by default) on the cost model: "
            "failures of its NPUs drawn from an MTBF per NPU, each losing the steps since the "
            "last checkpoint and waiting for detection, a spare, the restart and the "
            "checkpoint's reload. Prints the goodput and the recovery times."
        ),
    )
    days = DEFAULT_PROFILE.manager.training_run_s / DAY_S  # the published 40-day runs
    p.add_argument("--days", type=float, default=days, help=f"emulated days (default {days:g})")
    p.add_argument("--mtbf-hours", type=float, default=None, help="MTBF per NPU, hours")
    p.add_argument("--npus", type=int, default=384, help="the job's NPUs (default 384)")
    p.add_argument("--preset", default="cm384", help="the supernode (default cm384)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: the profile's)")
    p.add_argument("--expert-parallel", type=int, default=0, help="EP group size (0: 1)")
    p.add_argument("--spares", type=int, default=None, help="spare NPUs (default: per rack)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object")


def simulate_training_cmd(args: argparse.Namespace) -> int:
    mtbf = args.mtbf_hours or DEFAULT_PROFILE.training.mtbf_hours_per_npu
    result = simulate_training(
        days=args.days,
        mtbf_hours=mtbf,
        npus=args.npus,
        preset=args.preset,
        checkpoint_every=args.checkpoint_every,
        expert_parallel=args.expert_parallel,
        spares=args.spares,
        seed=args.seed,
    )
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    return 0


# --- live ----------------------------------------------------------------------------------------


def train_args(parser: argparse.ArgumentParser, add_state: Callable[[Any], None]) -> None:
    sub = parser.add_subparsers(dest="train_command", required=True, metavar="COMMAND")
    start = sub.add_parser("start", help="start a training job")
    start.add_argument("name")
    start.add_argument("--npus", type=int, required=True)
    start.add_argument("--model", default="")
    start.add_argument("--steps", type=int, default=0, help="0: until stopped")
    start.add_argument("--checkpoint-every", type=int, default=0)
    start.add_argument("--data-parallel", type=int, default=0)
    start.add_argument("--expert-parallel", type=int, default=0)
    start.add_argument("--micro-batches", type=int, default=0)
    start.add_argument(
        "--resume",
        action="store_true",
        help="go on from the last checkpoint in EMS of a stopped job of this name",
    )
    ls = sub.add_parser("ls", help="list the training jobs")
    get = sub.add_parser("get", help="one training job")
    get.add_argument("name")
    stop = sub.add_parser("stop", help="stop a training job and release its NPUs")
    stop.add_argument("name")
    stop.add_argument(
        "--checkpoint", action="store_true", help="write a checkpoint of its last step first"
    )
    for p in (start, ls, get, stop):
        p.add_argument("--json", action="store_true")
        add_state(p)


COLUMNS: list[Column] = [
    ("name", "NAME", "<20"),
    ("state", "STATE", "<10"),
    ("step", "STEP", ">8"),
    ("checkpoint", "CKPT", ">8"),
    ("npus", "NPUS", ">4"),
    ("restarts", "RESTARTS", ">8"),
    ("lost", "LOST", ">6"),
    ("step_s", "STEP_S", ">8"),
    ("goodput", "GOODPUT", ">7"),
]


def _row(job: TrainingJob) -> dict[str, Any]:
    return {
        "name": job.name,
        "state": job.state,
        "step": job.step,
        "checkpoint": job.last_checkpoint_step,
        "npus": len(job.npus),
        "restarts": job.restarts,
        "lost": job.steps_lost,
        "step_s": f"{job.step_s:.3f}",
        "goodput": f"{job.goodput:.3f}",
    }


def _job_dict(job: TrainingJob) -> dict[str, Any]:
    """The job as cmemu.v1.TrainingJob's JSON spells it."""
    return wire_dict(
        [
            ("name", job.name),
            ("state", job.state),
            ("step", job.step, "int64"),
            ("last_checkpoint_step", job.last_checkpoint_step, "int64"),
            ("npus", job.npus),
            ("restarts", job.restarts),
            ("steps_lost", job.steps_lost, "int64"),
            ("step_s", job.step_s),
            ("started_ns", job.started_ns, "int64"),
            ("last_failure_ns", job.last_failure_ns, "int64"),
            ("last_restored_ns", job.last_restored_ns, "int64"),
            ("goodput", job.goodput),
            ("failed_steps", job.failed_steps, "int64"),
            ("last_corrupt_checkpoint_ns", job.last_corrupt_checkpoint_ns, "int64"),
        ]
    )


async def _call(args: argparse.Namespace) -> list[TrainingJob]:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        training = TrainingClient(clients)
        command = args.train_command
        if command == "start":
            if args.npus < 1:
                raise UsageError("--npus must be >= 1")
            job = TrainingSpec(
                name=args.name,
                npus=args.npus,
                model=args.model,
                checkpoint_every=args.checkpoint_every,
                data_parallel=args.data_parallel,
                expert_parallel=args.expert_parallel,
                micro_batches=args.micro_batches,
                steps=args.steps,
            )
            return [await training.start(job, resume=args.resume)]
        if command == "ls":
            return await training.list()
        if command == "get":
            return [await training.get(args.name)]
        return [await training.stop(args.name, checkpoint=args.checkpoint)]
    finally:
        await clients.close()


def cmd_train(args: argparse.Namespace) -> int:
    jobs = asyncio.run(_call(args))
    if args.json:
        rows = [_job_dict(j) for j in jobs]
        print(json.dumps(rows if args.train_command == "ls" else rows[0], indent=2))
        return 0
    print_rows([_row(j) for j in jobs], COLUMNS, as_json=False)
    return 0
