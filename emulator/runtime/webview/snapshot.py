"""The web view's picture of the machine: plain data the collector writes and the page reads.

One `Machine` holds the latest value of everything the page shows and remembers what changed
since the last diff, so the server streams only that (`diff()`); a new page gets all of it
(`full()`). It knows nothing of gRPC or HTTP: the collector feeds it, the server serves it.
Telemetry is per NPU package, so both dies of an NPU show the package's HBM and utilisation;
health is per device server, so both dies turn red together.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import (
    DeviceKind,
    die_id,
    directed_link_id,
    parse_node,
    supernode_id,
)
from cmemu.emulator.model.topology import LinkKind, Topology

SERVING = "SERVING"
TIMELINE = 200  # events the page keeps
Json = dict[str, Any]


def layout(topology: Topology, profile: HardwareProfile) -> Json:
    """Supernodes > racks > nodes > NPUs > dies, in topology order: what the heat map draws."""
    per_rack = int(profile.node.nodes_per_rack)
    out: dict[str, dict[str, dict[str, list[Json]]]] = {}
    for node in topology.nodes:
        name = parse_node(node)
        rack = f"rack {name.index // per_rack:02d}"
        npus = [
            {"id": d.id, "dies": [die_id(d.id, i) for i in range(int(profile.npu.dies))]}
            for d in topology.in_node(node)
            if d.kind is DeviceKind.NPU
        ]
        out.setdefault(supernode_id(name.supernode), {}).setdefault(rack, {})[node] = npus
    return {
        "supernodes": [
            {
                "id": sn,
                "racks": [
                    {"id": rack, "nodes": [{"id": n, "npus": npus} for n, npus in nodes.items()]}
                    for rack, nodes in racks.items()
                ],
            }
            for sn, racks in out.items()
        ]
    }


def plane_of_links(topology: Topology) -> dict[str, int]:
    """Each L1-L2 link's sub-plane (that of its switch ends), by its directed ids `a>b` and
    `b>a`: the fabric reports links by direction."""
    planes = {s.id: s.plane for s in topology.switches}
    out: dict[str, int] = {}
    for link in topology.links:
        if link.kind is LinkKind.L1_L2:
            plane = planes[link.b] if link.b in planes else planes[link.a]
            out[directed_link_id(link.a, link.b)] = out[directed_link_id(link.b, link.a)] = plane
    return out


@dataclass(frozen=True, kw_only=True)
class LinkSample:
    """One directed link as the fabric reports it (fabric.proto LinkStat)."""

    link: str
    kind: str
    capacity_gb_s: float
    bytes: int
    utilization: float
    active_flows: int
    up: bool


def plane_utilisation(samples: Iterable[LinkSample], planes: Mapping[str, int]) -> Json:
    """Per L2 sub-plane: carried rate over live capacity of its L1-L2 links, links down."""
    rate: dict[int, float] = {}
    capacity: dict[int, float] = {}
    down: dict[int, int] = {}
    for s in samples:
        plane = planes.get(s.link)
        if plane is None:
            continue
        rate[plane] = rate.get(plane, 0.0) + s.utilization * s.capacity_gb_s
        capacity[plane] = capacity.get(plane, 0.0) + s.capacity_gb_s
        down[plane] = down.get(plane, 0) + (not s.up)
    every = sorted(set(planes.values()))
    return {
        str(p): {
            "utilization": rate.get(p, 0.0) / capacity[p] if capacity.get(p) else 0.0,
            "capacity_gb_s": capacity.get(p, 0.0),
            "links_down": down.get(p, 0),
        }
        for p in every
    }


@dataclass(kw_only=True)
class Recovery:
    """How long devices stayed out of service, as the view saw it (health transitions),
    in emulated seconds."""

    time_scale: float
    down_since: dict[str, float] = field(default_factory=dict)  # device: wall seconds
    durations: list[float] = field(default_factory=list)

    def went(self, device: str, serving: bool, wall_s: float) -> None:
        if not serving:
            self.down_since.setdefault(device, wall_s)
        elif device in self.down_since:
            self.durations.append((wall_s - self.down_since.pop(device)) * self.time_scale)

    def figures(self) -> Json | None:
        if not self.durations and not self.down_since:
            return None
        d = self.durations
        return {
            "down_now": len(self.down_since),
            "recovered": len(d),
            "last_s": d[-1] if d else None,
            "mean_s": sum(d) / len(d) if d else None,
            "max_s": max(d) if d else None,
        }


class Machine:
    """The latest picture and what changed since the last `diff()`."""

    def __init__(
        self,
        topology: Topology,
        profile: HardwareProfile,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topology = topology
        self._clock = clock
        self.layout = layout(topology, profile)
        self.planes = plane_of_links(topology)
        self.devices: dict[str, Json] = {
            d.id: {"kind": d.kind.value, "node": d.node, "health": "UNKNOWN"}
            for d in topology.devices
        }
        self.sections: Json = {
            "links": [],
            "planes": plane_utilisation([], self.planes),
            "faults": [],
            "serving": None,
            "recovery": None,
            "sources": {},
        }
        self.timeline: deque[Json] = deque(maxlen=TIMELINE)
        self.recovery = Recovery(time_scale=topology.time_scale)
        self.version = 0
        self._changed_devices: set[str] = set()
        self._changed_sections: set[str] = set()
        self._new_events: list[Json] = []

    # --- writers (the collector) ---------------------------------------------------------------

    def update_device(self, device: str, **values: Any) -> None:
        entry = self.devices[device]
        changed = {k: v for k, v in values.items() if entry.get(k) != v}
        if not changed:
            return
        if "health" in changed:
            self.recovery.went(device, changed["health"] == SERVING, self._clock())
            self.set_section("recovery", self.recovery.figures())
        entry.update(changed)
        self._changed_devices.add(device)

    def set_section(self, name: str, value: Any) -> None:
        if self.sections.get(name) != value:
            self.sections[name] = value
            self._changed_sections.add(name)

    def set_source(self, name: str, status: str) -> None:
        """How a feed is doing ("ok", "none", or what went wrong), shown in the page's footer."""
        sources = self.sections["sources"]
        if sources.get(name) != status:
            self.set_section("sources", {**sources, name: status})

    def event(self, device: str, event: str, detail: str = "", wall: float | None = None) -> None:
        entry = {"wall": self._clock() if wall is None else wall, "device": device}
        entry |= {"event": event, "detail": detail}
        self.timeline.append(entry)
        self._new_events.append(entry)

    # --- readers (the server) ------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return bool(self._changed_devices or self._changed_sections or self._new_events)

    def full(self) -> Json:
        return {
            "version": self.version,
            "supernode": self.topology.supernode,
            "preset": self.topology.preset,
            "time_scale": self.topology.time_scale,
            "epoch_wall_s": self.topology.epoch_wall_s,
            "layout": self.layout,
            "devices": self.devices,
            "events": list(self.timeline),
            **self.sections,
        }

    def diff(self) -> Json:
        """What changed since the last diff (and bumps the version); empty when nothing did."""
        if not self.dirty:
            return {}
        self.version += 1
        out: Json = {"version": self.version}
        if self._changed_devices:
            out["devices"] = {d: self.devices[d] for d in sorted(self._changed_devices)}
        for name in sorted(self._changed_sections):
            out[name] = self.sections[name]
        if self._new_events:
            out["events"] = self._new_events
        self._changed_devices, self._changed_sections, self._new_events = set(), set(), []
        return out
