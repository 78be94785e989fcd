"""The Fabric service's messages <-> domain types (collectives, faults, link stats, the clock)."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.engines.clock import ClockState
from cmemu.emulator.engines.fabric.types import LinkStat, LinkStats
from cmemu.emulator.engines.peers import CollectiveOutcome, FlowTime
from cmemu.emulator.model.arrivals import Arrival, ArrivalBatch
from cmemu.emulator.model.clock import Segment
from cmemu.emulator.model.collectivespec import COLLECTIVE_OPS, CollectiveSpec
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults import fabric
from cmemu.emulator.model.faults.fabric import FaultSpec, NoParams
from cmemu.v1 import fabric_pb2

OPS = {
    fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL: "all-to-all",
    fabric_pb2.COLLECTIVE_OP_ALL_GATHER: "all-gather",
    fabric_pb2.COLLECTIVE_OP_REDUCE_SCATTER: "reduce-scatter",
    fabric_pb2.COLLECTIVE_OP_ALL_REDUCE: "all-reduce",
    fabric_pb2.COLLECTIVE_OP_BROADCAST: "broadcast",
    fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH: "moe-dispatch",
    fabric_pb2.COLLECTIVE_OP_MOE_COMBINE: "moe-combine",
}
assert set(OPS.values()) == set(COLLECTIVE_OPS)
WIRE_OPS = {name: op for op, name in OPS.items()}


def collective_spec(request: fabric_pb2.CollectiveRequest) -> CollectiveSpec:
    if request.op not in OPS:
        raise InvalidArgumentError(
            f"op must be one of {', '.join(fabric_pb2.CollectiveOp.keys()[1:])}", field="op"
        )
    return CollectiveSpec(
        op=OPS[request.op],
        bytes=request.bytes,
        bytes_per_pair=request.bytes_per_pair,
        pair_bytes=tuple(request.pair_bytes),
        root=request.root,
        tokens_per_rank=request.tokens_per_rank,
        top_k=request.top_k,  # 0: the profile's (run_collective)
        bytes_per_token=request.bytes_per_token,
    )


def collective_request(
    ranks: list[str], spec: CollectiveSpec, *, detail: bool
) -> fabric_pb2.CollectiveRequest:
    return fabric_pb2.CollectiveRequest(
        op=WIRE_OPS[spec.op],
        ranks=ranks,
        bytes=spec.bytes,
        bytes_per_pair=spec.bytes_per_pair,
        pair_bytes=spec.pair_bytes,
        root=spec.root,
        tokens_per_rank=spec.tokens_per_rank,
        top_k=spec.top_k,
        bytes_per_token=spec.bytes_per_token,
        flow_detail=detail,
    )


def collective_result(o: CollectiveOutcome) -> fabric_pb2.CollectiveResult:
    return fabric_pb2.CollectiveResult(
        op=WIRE_OPS[o.op],
        ranks=o.ranks,
        phases=o.phases,
        flows=o.flows,
        total_bytes=o.total_bytes,
        issue_ns=o.issue_ns,
        complete_ns=o.complete_ns,
        duration_ns=o.duration_ns,
        overhead_ns=o.overhead_ns,
        wall_compute_ms=o.wall_compute_ms,
        compute_share=o.compute_share,
        flow_timings=[
            fabric_pb2.FlowTiming(
                src=f.src, dst=f.dst, bytes=f.bytes, complete_ns=f.complete_ns, gb_s=f.gb_s
            )
            for f in o.detail
        ],
    )


def collective_outcome(r: fabric_pb2.CollectiveResult) -> CollectiveOutcome:
    return CollectiveOutcome(
        op=OPS[r.op],
        ranks=r.ranks,
        phases=r.phases,
        flows=r.flows,
        total_bytes=r.total_bytes,
        issue_ns=r.issue_ns,
        complete_ns=r.complete_ns,
        overhead_ns=r.overhead_ns,
        wall_compute_ms=r.wall_compute_ms,
        compute_share=r.compute_share or 1.0,  # an older fabric sends none
        detail=tuple(
            FlowTime(src=f.src, dst=f.dst, bytes=f.bytes, complete_ns=f.complete_ns, gb_s=f.gb_s)
            for f in r.flow_timings
        ),
    )


def fault_spec(m: fabric_pb2.FabricFault) -> FaultSpec[Any]:
    """The fault a FabricFault asks for, its oneof unpacked into its kind's params and checked
    (an unknown kind carries NoParams, for the fabric to name)."""
    params = faultparams.unpack(m, fabric.PARAMS)
    return FaultSpec(
        kind=m.kind,
        params=NoParams() if params is None else params,
        target=m.target,
        for_s=m.for_s,
        id=m.id,
        since_s=m.since_ns / 1e9,
    )


def fault_proto(spec: FaultSpec[Any]) -> fabric_pb2.FabricFault:
    m = fabric_pb2.FabricFault(
        id=spec.id,
        kind=spec.kind,
        target=spec.target,
        for_s=spec.for_s,
        since_ns=round(spec.since_s * 1e9),
        until_ns=round(spec.until_s * 1e9),
    )
    return faultparams.pack(m, spec.kind, spec.params if spec.kind in fabric.PARAMS else None)


def link_stats_proto(stats: LinkStats) -> fabric_pb2.LinkStats:
    return fabric_pb2.LinkStats(
        emulated_ns=stats.emulated_ns,
        links=[link_stat_proto(s) for s in stats.links],
        active_flows=stats.active_flows,
        completed_flows=stats.completed_flows,
    )


def link_stat_proto(s: LinkStat) -> fabric_pb2.LinkStat:
    return fabric_pb2.LinkStat(
        link=s.link,
        kind=s.kind,
        capacity_gb_s=s.capacity_bytes_per_s / 1e9,
        bytes=s.bytes,
        utilization=s.utilization,
        active_flows=s.active_flows,
        up=s.up,
    )


def segment_proto(state: ClockState) -> fabric_pb2.ClockSegment:
    s = state.segment
    return fabric_pb2.ClockSegment(
        wall_s=s.wall_s,
        emulated_ns=s.emulated_ns,
        rate=s.rate,
        horizon_wall_s=state.horizon_wall_s,
        time_scale=state.time_scale,
        epoch_wall_s=state.epoch_wall_s,
    )


def clock_state(m: fabric_pb2.ClockSegment) -> ClockState:
    return ClockState(
        segment=Segment(wall_s=m.wall_s, emulated_ns=m.emulated_ns, rate=m.rate),
        horizon_wall_s=m.horizon_wall_s,
        time_scale=m.time_scale,
        epoch_wall_s=m.epoch_wall_s,
    )


def arrivals_proto(batch: ArrivalBatch) -> fabric_pb2.CollectiveArrivals:
    return fabric_pb2.CollectiveArrivals(
        arrivals=[
            fabric_pb2.CollectiveArrival(
                seq=a.seq, op=WIRE_OPS[a.op], issue_ns=a.issue_ns, ranks=a.ranks,
                ready_ns=a.ready_ns,
            )
            for a in batch.arrivals
        ],
        last_seq=batch.last_seq,
        dropped=batch.dropped,
    )  # fmt: skip


def arrival_batch(reply: fabric_pb2.CollectiveArrivals) -> ArrivalBatch:
    return ArrivalBatch(
        arrivals=tuple(
            Arrival(
                seq=a.seq, op=OPS[a.op], issue_ns=a.issue_ns, ranks=tuple(a.ranks),
                ready_ns=tuple(a.ready_ns),
            )
            for a in reply.arrivals
        ),
        last_seq=reply.last_seq,
        dropped=reply.dropped,
    )  # fmt: skip


def link_stats(m: fabric_pb2.LinkStats) -> LinkStats:
    """The inverse of `link_stats_proto` (capacity back in bytes per second: GB/s * 1e9 / 1e9
    gives the wire's double back exactly, so a reader printing GB/s prints what was sent)."""
    return LinkStats(
        emulated_ns=m.emulated_ns,
        links=tuple(
            LinkStat(
                link=s.link,
                kind=s.kind,
                capacity_bytes_per_s=s.capacity_gb_s * 1e9,
                bytes=s.bytes,
                utilization=s.utilization,
                active_flows=s.active_flows,
                up=s.up,
            )
            for s in m.links
        ),
        active_flows=m.active_flows,
        completed_flows=m.completed_flows,
    )
