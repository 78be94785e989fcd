"""The scheduler's messages: its engine's values (emulator/model/scheduler/grants.py) as
protobufs, and the day plans' (serve by day, train by night) both ways: a StartDayPlan as the
engine's ask (emulator/engines/scheduler/dayplans.py), a plan's runner as a DayPlan. The typed
client (emulator/client/scheduler.py) reads the same messages back into the same values."""

from __future__ import annotations

from cmemu.emulator.engines.dayplan import DayRunner
from cmemu.emulator.engines.scheduler.dayplans import DayPlanAsk
from cmemu.emulator.model.daylive import DAY, NIGHT
from cmemu.emulator.model.scheduler.grants import (
    Allocation,
    AllocationChange,
    Occupancy,
    PolicyInfo,
    Spares,
)
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.v1 import scheduler_pb2


def allocation_message(a: Allocation) -> scheduler_pb2.Allocation:
    return scheduler_pb2.Allocation(
        job=a.job,
        npus=[
            scheduler_pb2.AllocatedNpu(
                id=n.id, node=n.node, rack=n.rack, dies=list(n.dies), failed=n.failed
            )
            for n in a.npus
        ],
        nodes=list(a.nodes),
        racks=list(a.racks),
        policy=a.policy,
        priority=a.priority,
        whole_nodes=a.whole_nodes,
        same_rack=a.same_rack,
        allocated_ns=a.allocated_ns,
    )


def change_message(c: AllocationChange) -> scheduler_pb2.AllocationEvent:
    return scheduler_pb2.AllocationEvent(
        allocation=allocation_message(c.allocation), change=c.change, npus=c.npus, at_ns=c.at_ns
    )


def spares_message(s: Spares) -> scheduler_pb2.Spares:
    return scheduler_pb2.Spares(target=s.target, npus=s.npus)


def occupancy_message(o: Occupancy) -> scheduler_pb2.ListAllocationsResponse:
    return scheduler_pb2.ListAllocationsResponse(
        allocations=[allocation_message(a) for a in o.allocations],
        total_npus=o.total_npus,
        free_npus=o.free_npus,
        allocated_npus=o.allocated_npus,
        spare_npus=o.spare_npus,
        failed_npus=o.failed_npus,
    )


def policies_message(policies: list[PolicyInfo]) -> scheduler_pb2.ListPoliciesResponse:
    return scheduler_pb2.ListPoliciesResponse(
        policies=[
            scheduler_pb2.PolicyInfo(name=p.name, description=p.description) for p in policies
        ],
        default_policy=next(p.name for p in policies if p.default),
    )


def day_plan_ask(request: scheduler_pb2.StartDayPlanRequest) -> DayPlanAsk:
    t = request.training
    job = (
        TrainingSpec(
            name=t.name,
            npus=t.npus,
            model=t.model,
            checkpoint_every=t.checkpoint_every,
            data_parallel=t.data_parallel,
            expert_parallel=t.expert_parallel,
            micro_batches=t.micro_batches,
        )
        if request.HasField("training")
        else None
    )
    return DayPlanAsk(
        name=request.name,
        deployment=request.deployment,
        job=job,
        night=request.night,
        hour_s=request.hour_s,
        start_hour=request.start_hour,
        hours=request.hours,
        night_decode_npus=request.night_decode_npus,
        drain_s=request.drain_s,
    )


def day_plan_message(runner: DayRunner) -> scheduler_pb2.DayPlan:
    status, spec = runner.status, runner.spec
    start, end = spec.night
    return scheduler_pb2.DayPlan(
        name=spec.name,
        deployment=spec.deployment,
        training_job=spec.job.name,
        night=f"{start:g}-{end:g}",
        hour_s=spec.hour_s,
        start_hour=spec.start_hour,
        hours=spec.hours,
        state=status.state,
        plan_hour=runner.hour_now(),
        switches=[
            scheduler_pb2.DaySwitch(
                at_ns=s.at_ns,
                plan_hour=s.plan_hour,
                to=s.to,
                duration_ns=s.duration_ns,
                npus=s.npus,
            )
            for s in status.switches
        ],
        periods=[
            scheduler_pb2.DayPeriod(
                kind=p.kind,
                start_ns=p.start_ns,
                end_ns=p.end_ns,
                served_tokens=p.served_tokens,
                training_steps=p.training_steps,
            )
            for p in status.periods
        ],
        served_tokens_day=status.served(DAY),
        served_tokens_night=status.served(NIGHT),
        training_steps=status.training_steps,
        training_step=status.step,
        started_ns=status.started_ns,
        error=status.error,
        night_decode_npus=spec.night_decode_npus,
        drain_s=spec.drain_s,
    )
