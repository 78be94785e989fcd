"""Prometheus metrics: what every process of the emulator shows at `GET /metrics`.

Where and how they are served is emulator/runtime/metricserver.py; this module says what.

They are read from the servers' state when a scrape asks, so that nothing is counted on a hot path
except what no state keeps (the emulated-latency histograms of UB transactions and kernels,
fixed buckets in each device's state, emulator/model/instruments.py). The state belongs to the
event loop, so it is read there, in one pass; the text is formatted on a worker thread.

- devices (labels supernode, device, node, kind): health, memory used and capacity (HBM for an
  NPU, DRAM for a CPU and a pool), compute utilisation, UB transactions and bytes issued and
  applied, UB latency by op and kernel latency (emulated), inbox depth, times faulted;
- the fabric (labels supernode, device, kind): bytes, utilisation, capacity and links down per
  UB plane and link kind, flows in flight and completed, collectives in progress, active faults
  by kind;
- EMS: objects and bytes per tier, hits, misses, evictions, corrupt copies, under-replicated
  objects, each pool's health and use;
- the process (label supernode): emulated time, time scale, servers hosted, the MQTT link
  (connected, backlog, dropped), and the process_* families (CPU, memory, fds;
  emulator/runtime/exposition.py);
- any other service state with a `metrics()` method (instruments.Instrumented): what it returns,
  with the service's labels added. This is how the serving router publishes TTFT and TPOT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.model.instruments import Family, Histogram, MetricType, Value
from cmemu.emulator.model.topology import DeviceKind, ServiceKind
from cmemu.emulator.runtime.exposition import RawFamily

if TYPE_CHECKING:
    from cmemu.emulator.runtime.inprocess import InProcessSupernode

log = structlog.get_logger("cmemu.metrics")

# --- families, in plain data ------------------------------------------------------------------


class Families:
    """Families under construction, by name, in the order first added."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[str, MetricType, list[tuple[Mapping[str, str], Value]]]] = {}

    def add(
        self, name: str, kind: MetricType, help: str, labels: Mapping[str, str], v: Value
    ) -> None:
        entry = self._by_name.get(name)
        if entry is None:
            entry = self._by_name[name] = (help, kind, [])
        entry[2].append((labels, v.snapshot() if isinstance(v, Histogram) else v))

    def add_all(
        self, name: str, kind: MetricType, help: str, samples: list[tuple[Mapping[str, str], float]]
    ) -> None:
        """Plain numbers only (histograms go through add, which copies them)."""
        entry = self._by_name.get(name)
        if entry is None:
            entry = self._by_name[name] = (help, kind, [])
        entry[2].extend(samples)

    def extend(self, families: Iterable[Family], base: Mapping[str, str]) -> None:
        for f in families:
            for labels, value in f.samples:
                self.add(f.name, f.type, f.help, {**base, **labels}, value)

    def raw(self) -> list[RawFamily]:
        """Every family with samples, as the exposition writes them (exposition.render)."""
        return [
            (name, help, kind, samples)
            for name, (help, kind, samples) in self._by_name.items()
            if samples
        ]


# --- devices ----------------------------------------------------------------------------------


# name, type, help, and how to read it from a device's state
DEVICE_METRICS: tuple[tuple[str, MetricType, str, Callable[[DeviceEngine], float]], ...] = (
    (
        "cmemu_device_healthy",
        "gauge",
        "1 when the device serves, 0 when faulted",
        lambda s: float(not s.fault.faulted),
    ),
    (
        "cmemu_device_faults_total",
        "counter",
        "Times the device went down",
        lambda s: s.counters.faults,
    ),
    (
        "cmemu_device_memory_capacity_bytes",
        "gauge",
        "UB-addressable memory: the HBM of an NPU, the DRAM of a CPU or a pool",
        lambda s: s.memory.capacity,
    ),
    (
        "cmemu_device_memory_used_bytes",
        "gauge",
        "Memory allocated in regions",
        lambda s: s.memory.allocator.used,
    ),
    (
        "cmemu_device_memory_stored_bytes",
        "gauge",
        "Real bytes kept for what was written",
        lambda s: s.memory.store.stored_bytes,
    ),
    ("cmemu_device_regions", "gauge", "Regions allocated", lambda s: s.memory.allocator.count),
    (
        "cmemu_device_inbox_messages",
        "gauge",
        "UB SEND messages waiting for Receive",
        lambda s: s.inbox_depth,
    ),
    (
        "cmemu_ub_issued_total",
        "counter",
        "UB transactions this device issued that completed",
        lambda s: s.counters.tx_count,
    ),
    (
        "cmemu_ub_issued_bytes_total",
        "counter",
        "Bytes of the UB transactions this device issued that completed",
        lambda s: s.counters.tx_bytes,
    ),
    (
        "cmemu_ub_applied_total",
        "counter",
        "UB transactions applied to this device's memory or inbox",
        lambda s: s.counters.rx_count,
    ),
    (
        "cmemu_ub_applied_bytes_total",
        "counter",
        "Bytes of the UB transactions applied here",
        lambda s: s.counters.rx_bytes,
    ),
)


def add_devices(out: Families, engines: Iterable[DeviceEngine], supernode: str) -> None:
    states = list(engines)
    every = [
        {
            "supernode": supernode,
            "device": s.device.id,
            "node": s.device.node,
            "kind": s.device.kind.value,
        }
        for s in states
    ]
    for name, kind, help, read in DEVICE_METRICS:  # family by family: one pass each, no lookups
        out.add_all(
            name,
            kind,
            help,
            [(labels, float(read(s))) for labels, s in zip(every, states, strict=True)],
        )
    for labels, s in zip(every, states, strict=True):
        d = s.device
        if s.dies.count:
            out.add(
                "cmemu_device_utilization_ratio",
                "gauge",
                "Busy share of the compute engines (NPU dies) since emulated time started",
                labels,
                s.dies.utilization(),
            )
        for op, histogram in sorted(s.latency.ub.items()):
            out.add(
                "cmemu_ub_latency_seconds",
                "histogram",
                "Emulated latency, issue to completion, of UB transactions issued here, by op",
                {**labels, "op": op},
                histogram,
            )
        if d.kind is DeviceKind.NPU and s.latency.kernel.count:  # as UB ops: once there are some
            out.add(
                "cmemu_npu_kernel_latency_seconds",
                "histogram",
                "Emulated latency of kernels, issue to completion (queueing on the die included)",
                labels,
                s.latency.kernel,
            )


# --- the collector ----------------------------------------------------------------------------


class SupernodeCollector:
    """Everything one process hosts, read from its state at each collect(); on the event loop."""

    def __init__(self, local: InProcessSupernode) -> None:
        self.local = local

    def families(self) -> Families:
        local, out = self.local, Families()
        topology = local.topology
        sn = topology.supernode
        process = {"supernode": sn}
        if local.time is not None:
            for name, kind, help, value in self._process(local.time):
                out.add(name, kind, help, process, value)
        add_devices(out, list(local.devices.values()), sn)
        for service, (state, _) in list(local.services.items()):
            base = {"supernode": sn, "device": topology.service(service).id, "kind": service.value}
            try:
                out.extend(self._service(service, state), base)
            except Exception:  # one service's metrics must not take the others' away
                log.exception("service metrics failed", service=service.value)
        return out

    def _process(self, time: TimeKeeper) -> list[tuple[str, MetricType, str, float]]:
        local = self.local
        clock = time.clock
        rows: list[tuple[str, MetricType, str, float]] = [
            (
                "cmemu_emulated_seconds",
                "gauge",
                "Emulated time since the supernode started",
                clock.now_ns() / 1e9,
            ),
            (
                "cmemu_time_scale",
                "gauge",
                "Emulated seconds per wall second asked for (a ceiling)",
                clock.time_scale,
            ),
            (
                "cmemu_time_rate",
                "gauge",
                "Emulated seconds per wall second now (slower when the emulator lags)",
                clock.rate,
            ),
            (
                "cmemu_time_achieved_scale",
                "gauge",
                "Emulated seconds per wall second since the epoch",
                clock.achieved_scale(),
            ),
            (
                "cmemu_time_stalled_seconds_total",
                "counter",
                "Wall seconds of stalls cut out of emulated time",
                clock.stalled_wall_s,
            ),
            (
                "cmemu_time_longest_stall_seconds",
                "gauge",
                "Wall seconds of the longest stall cut out of emulated time",
                clock.longest_stall_wall_s,
            ),
            (
                "cmemu_event_loop_lag_seconds",
                "gauge",
                "Wall seconds this process's event loop ran late at its last tick",
                time.governor.last_lag_s,
            ),
            (
                "cmemu_process_servers",
                "gauge",
                "gRPC servers this process hosts",
                len(local.hosted),
            ),
        ]
        bus = local.events
        if bus is not None:
            rows += [
                ("cmemu_mqtt_connected", "gauge", "1 while the broker link is up", bus.connected),
                ("cmemu_mqtt_backlog_messages", "gauge", "Events kept for the broker", bus.pending),
                (
                    "cmemu_mqtt_dropped_total",
                    "counter",
                    "Events lost to the buffer bound",
                    bus.dropped,
                ),
            ]
        return rows

    def _service(self, kind: ServiceKind, state: object) -> Iterable[Family]:
        if kind is ServiceKind.EMS:  # numpy: only where it is hosted
            from cmemu.emulator.runtime import servicemetrics as sm

            if isinstance(state, sm.EmsState):
                return sm.ems_families(state)
        contribute = getattr(state, "metrics", None)  # instruments.Instrumented
        return list(contribute()) if callable(contribute) else []


__all__ = ["Families", "SupernodeCollector", "add_devices"]
