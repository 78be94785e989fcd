"""The Device, Npu and UnifiedBus services' messages <-> domain types."""

from __future__ import annotations

from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.engines.device.engine import FaultState, Telemetry
from cmemu.emulator.engines.device.faultbase import ActiveFault
from cmemu.emulator.engines.device.liveness import Beat
from cmemu.emulator.engines.device.npu import Kernel, KernelResult
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.memory import Region, RegionPage
from cmemu.v1 import device_pb2, npu_pb2


def region_proto(region: Region, eid: int) -> device_pb2.Region:
    return device_pb2.Region(
        region_id=region.region_id,
        eid=eid,
        offset=region.offset,
        size=region.size,
        label=region.label,
    )


def region(m: device_pb2.Region) -> Region:
    return Region(region_id=m.region_id, offset=m.offset, size=m.size, label=m.label)


def region_page_proto(page: RegionPage, eid: int) -> device_pb2.ListRegionsResponse:
    return device_pb2.ListRegionsResponse(
        regions=[region_proto(r, eid) for r in page.regions],
        capacity_bytes=page.capacity_bytes,
        used_bytes=page.used_bytes,
        free_bytes=page.free_bytes,
        largest_free_bytes=page.largest_free_bytes,
        next_page_token=page.next_page_token,
        region_count=page.region_count,
    )


def region_page(m: device_pb2.ListRegionsResponse) -> RegionPage:
    return RegionPage(
        regions=tuple(region(r) for r in m.regions),
        next_page_token=m.next_page_token,
        capacity_bytes=m.capacity_bytes,
        used_bytes=m.used_bytes,
        free_bytes=m.free_bytes,
        largest_free_bytes=m.largest_free_bytes,
        region_count=m.region_count,
    )


def fault_state_proto(f: FaultState) -> device_pb2.FaultState:
    return device_pb2.FaultState(faulted=f.faulted, reason=f.reason, since_ns=f.since_ns)


def fault_state(m: device_pb2.FaultState) -> FaultState:
    return FaultState(faulted=m.faulted, reason=m.reason, since_ns=m.since_ns)


def active_fault_proto(
    f: ActiveFault, device: str, *, faulted: bool = True
) -> device_pb2.FaultState:
    state = device_pb2.FaultState(
        faulted=faulted,
        kind=f.kind,
        reason=f.reason,
        since_ns=f.since_ns,
        until_ns=f.until_ns,
        for_s=f.for_s,
        device=device,
    )
    return faultparams.pack(state, f.kind, f.params)


def fault_request(
    kind: str, params: object | None, *, for_s: float | None = None, device: str = ""
) -> device_pb2.FaultState:
    """An InjectFault request: `kind` with its typed params on `device` (empty: the one
    called), for `for_s` emulated seconds (None or 0: until cleared)."""
    return faultparams.pack(
        device_pb2.FaultState(kind=kind, for_s=for_s or 0.0, device=device), kind, params
    )


def telemetry_proto(t: Telemetry) -> device_pb2.Telemetry:
    return device_pb2.Telemetry(
        device=t.device,
        emulated_ns=t.emulated_ns,
        memory_capacity_bytes=t.memory_capacity_bytes,
        memory_used_bytes=t.memory_used_bytes,
        stored_bytes=t.stored_bytes,
        regions=t.regions,
        ub_tx_count=t.ub_tx_count,
        ub_tx_bytes=t.ub_tx_bytes,
        ub_rx_count=t.ub_rx_count,
        ub_rx_bytes=t.ub_rx_bytes,
        inbox_depth=t.inbox_depth,
        utilization=t.utilization,
        faulted=t.faulted,
        broker_connected=t.broker_connected,
        events_pending=t.events_pending,
        events_dropped=t.events_dropped,
        ecc_uncorrectable_errors=t.ecc_uncorrectable_errors,
        ecc_poisoned_bytes=t.ecc_poisoned_bytes,
        dies_down=t.dies_down,
        compute_share=t.compute_share,
        fault_errors=t.fault_errors,
        faults=t.faults,
    )


def telemetry(m: device_pb2.Telemetry) -> Telemetry:
    return Telemetry(
        device=m.device,
        emulated_ns=m.emulated_ns,
        memory_capacity_bytes=m.memory_capacity_bytes,
        memory_used_bytes=m.memory_used_bytes,
        stored_bytes=m.stored_bytes,
        regions=m.regions,
        ub_tx_count=m.ub_tx_count,
        ub_tx_bytes=m.ub_tx_bytes,
        ub_rx_count=m.ub_rx_count,
        ub_rx_bytes=m.ub_rx_bytes,
        inbox_depth=m.inbox_depth,
        utilization=m.utilization,
        faulted=m.faulted,
        broker_connected=m.broker_connected,
        events_pending=m.events_pending,
        events_dropped=m.events_dropped,
        ecc_uncorrectable_errors=m.ecc_uncorrectable_errors,
        ecc_poisoned_bytes=m.ecc_poisoned_bytes,
        dies_down=tuple(m.dies_down),
        compute_share=m.compute_share,
        fault_errors=m.fault_errors,
        faults=tuple(m.faults),
    )


def kernel(m: npu_pb2.Kernel) -> Kernel:
    if m.precision == npu_pb2.PRECISION_UNSPECIFIED:
        raise InvalidArgumentError("precision is required", field="precision")
    if m.precision not in npu_pb2.Precision.values():
        raise InvalidArgumentError(
            f"precision {m.precision} is not one of {', '.join(npu_pb2.Precision.keys()[1:])}",
            field="precision",
            reason="UNSUPPORTED_PRECISION",
        )
    return Kernel(
        name=m.name,
        die=m.die,
        flops=m.flops,
        bytes_moved=m.bytes_moved,
        precision=npu_pb2.Precision.Name(m.precision).removeprefix("PRECISION_"),
    )


def kernel_proto(k: Kernel) -> npu_pb2.Kernel:
    return npu_pb2.Kernel(
        name=k.name,
        die=k.die,
        flops=k.flops,
        bytes_moved=k.bytes_moved,
        precision=npu_pb2.Precision.Value(f"PRECISION_{k.precision}"),
    )


def kernel_result(m: npu_pb2.KernelResult) -> KernelResult:
    return KernelResult(
        name=m.name,
        die=m.die,
        issue_ns=m.issue_ns,
        start_ns=m.start_ns,
        complete_ns=m.complete_ns,
        duration_ns=m.duration_ns,
        bound=m.bound,
    )


def kernel_result_proto(r: KernelResult) -> npu_pb2.KernelResult:
    return npu_pb2.KernelResult(
        name=r.name,
        die=r.die,
        issue_ns=r.issue_ns,
        start_ns=r.start_ns,
        complete_ns=r.complete_ns,
        duration_ns=r.duration_ns,
        bound=r.bound,
    )


def liveness_proto(b: Beat) -> device_pb2.Liveness:
    return device_pb2.Liveness(
        emulated_ns=b.emulated_ns,
        process=b.process,
        covers=b.covers,
        answering=b.answering,
        unreachable=b.unreachable,
        down=b.down,
        dies_down=b.dies_down,
        interval_s=b.interval_s,
        ecc=b.ecc,
    )


def liveness(m: device_pb2.Liveness) -> Beat:
    return Beat(
        emulated_ns=m.emulated_ns,
        process=m.process,
        covers=tuple(m.covers),
        answering=tuple(m.answering),
        unreachable=tuple(m.unreachable),
        down=tuple(m.down),
        dies_down=tuple(m.dies_down),
        interval_s=m.interval_s,
        ecc=tuple(m.ecc),
    )
