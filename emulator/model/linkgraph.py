"""The fabric's link graph: directed links with their live state, grouped into trunks, and routes.

Every physical link of the topology becomes two directed links (UB links are full duplex). The
flow model does not share each of the 25,000 directed links of a cm384 separately: a transfer is
striped over the UB planes and adaptively sprayed over a plane's L2 chips, so the shared resources
are *trunks*, groups of parallel directed links whose capacity is the sum of their live members:

- an NPU die's 7 ports out (and in), a CPU's 7 ports out (and in), a pool's links to its CPUs;
- the die-to-die link of an NPU package, each direction;
- a node's 112 L1->L2 uplinks (and downlinks), all planes.

A flow's own ceiling is per plane: a plane carries it only where both ends have a live port on
that plane, and one flow is hashed to one L2 chip per plane (ECMP), so a single cross-node flow
meets the L1->L2 link's bandwidth, which is where the calibrated cross-node loss lives.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from emulator.model.costmodel import endpoint_latency_s, hop_latency_s, ub_efficiency
from emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
)
from emulator.model.flowsim import weighted_sum
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.topology import (
    Device,
    DeviceKind,
    LinkKind,
    Topology,
    die_port,
    l1_switch,
    l2_switch,
)

FloatArray = npt.NDArray[np.float64]
Incidence = tuple[tuple[int, float], ...]  # (trunk index, share of the flow that crosses it)
ROUTE_CACHE_MAX = 200_000


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where a flow starts or ends: an NPU die, a CPU, or a memory pool."""

    name: str
    device: Device
    out: Incidence
    inn: Incidence
    out_ports: tuple[tuple[int, ...], ...]  # per plane: the directed links leaving on it
    in_ports: tuple[tuple[int, ...], ...]
    local_bytes_per_s: float  # a transfer to itself: HBM or DRAM copy


@dataclass(frozen=True, kw_only=True)
class Route:
    resources: Incidence
    cap: float  # the flow's own ceiling, bytes/s
    latency_s: float
    hops: tuple[str, ...]
    planes: int


class LinkGraph:
    def __init__(self, topology: Topology, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.topology = topology
        self.profile = profile
        self.planes = profile.switch.l2_planes
        self.names: list[str] = []
        self.kinds: list[LinkKind] = []
        self._index: dict[str, int] = {}
        self._physical: dict[str, tuple[int, int]] = {}
        self._by_switch: dict[str, list[int]] = defaultdict(list)
        raw: list[float] = []
        eff = ub_efficiency(profile)
        loss = profile.ub.cross_node_bandwidth_loss
        for link in topology.links:
            scale = eff * ((1 - loss) if link.kind is LinkKind.L1_L2 else 1.0)
            pair = []
            for a, b in ((link.a, link.b), (link.b, link.a)):
                self._index[f"{a}>{b}"] = len(self.names)
                pair.append(len(self.names))
                self.names.append(f"{a}>{b}")
                self.kinds.append(link.kind)
                raw.append(link.bytes_per_s * scale)
            self._physical[link.id] = (pair[0], pair[1])
            for end in (link.a, link.b):
                self._by_switch[end].extend(pair)
        self.base_cap = np.array(raw)
        self.reset()
        self._build_trunks()
        self._build_endpoints()

    # --- live state --------------------------------------------------------------------------

    def reset(self) -> None:
        """Every link up, at full bandwidth, with no added latency."""
        n = len(self.names)
        self.up = np.ones(n, dtype=bool)
        self.factor = np.ones(n)
        self.extra_latency_s = np.zeros(n)
        self.partitions: list[tuple[frozenset[str], frozenset[str]]] = []
        self.invalidate()

    def invalidate(self) -> None:
        """Forget everything derived from the live state; whoever mutates it calls this."""
        self._cache: dict[str, FloatArray] = {}
        self._routes: dict[tuple[str, str], Route] = {}

    def _derived(self, name: str, compute: Callable[[], FloatArray]) -> FloatArray:
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def link_cap(self) -> FloatArray:
        return self._derived("link_cap", lambda: self.base_cap * self.factor * self.up)

    def physical(self, link_id: str) -> tuple[int, int]:
        """Both directions of a physical link "a~b" (either order)."""
        if link_id in self._physical:
            return self._physical[link_id]
        a, sep, b = link_id.partition("~")
        if sep and f"{b}~{a}" in self._physical:
            return self._physical[f"{b}~{a}"]
        raise NotFoundError(f"no link {link_id!r}; links are named 'a~b' (cmemu topology --json)")

    def switch_links(self, switch_id: str) -> list[int]:
        if switch_id not in self._switch_ids:
            raise NotFoundError(f"no switch {switch_id!r}")
        return self._by_switch[switch_id]

    # --- trunks ------------------------------------------------------------------------------

    def _trunk(self, name: str, members: Iterable[int]) -> int:
        index = len(self.trunk_names)
        self.trunk_names.append(name)
        self._trunk_index[name] = index
        for m in members:
            self._member_link.append(m)
            self._member_trunk.append(index)
        return index

    def _build_trunks(self) -> None:
        self.trunk_names: list[str] = []
        self._trunk_index: dict[str, int] = {}
        self._member_link: list[int] = []
        self._member_trunk: list[int] = []
        self._switch_ids = {s.id for s in self.topology.switches}
        outgoing: dict[str, list[int]] = defaultdict(list)
        incoming: dict[str, list[int]] = defaultdict(list)
        for i, name in enumerate(self.names):
            a, b = name.split(">")
            outgoing[a].append(i)
            incoming[b].append(i)
        for i, name in enumerate(self.names):
            if self.kinds[i] is LinkKind.DIE_TO_DIE:
                self._trunk(name, [i])
        endpoints = [
            die_port(d.id, die)
            for d in self.topology.of_kind(DeviceKind.NPU)
            for die in range(self.profile.npu.dies)
        ] + [d.id for d in self.topology.devices if d.kind is not DeviceKind.NPU]
        # An endpoint's trunk is its links into the switch layer (a pool's: to its CPUs); a
        # CPU's link to the pool belongs to the pool's trunk, not to the CPU's UB ports.
        own = {
            DeviceKind.NPU: LinkKind.DIE_PORT,
            DeviceKind.CPU: LinkKind.CPU_PORT,
            DeviceKind.MEMPOOL: LinkKind.POOL,
        }
        for ep in endpoints:
            kind = own[self.topology.device(ep.split(".", 1)[0]).kind]
            self._trunk(f"{ep}:out", [i for i in outgoing[ep] if self.kinds[i] is kind])
            self._trunk(f"{ep}:in", [i for i in incoming[ep] if self.kinds[i] is kind])
        for node in self.topology.nodes:
            l1s = [l1_switch(node, p) for p in range(self.planes)]
            self._trunk(
                f"{node}:up",
                [i for s in l1s for i in outgoing[s] if self.kinds[i] is LinkKind.L1_L2],
            )
            self._trunk(
                f"{node}:down",
                [i for s in l1s for i in incoming[s] if self.kinds[i] is LinkKind.L1_L2],
            )
        self.member_link = np.array(self._member_link, dtype=np.int64)
        self.member_trunk = np.array(self._member_trunk, dtype=np.int64)
        self._outgoing, self._incoming = outgoing, incoming

    def trunk(self, name: str) -> int:
        return self._trunk_index[name]

    def trunk_cap(self) -> FloatArray:
        return self._derived(
            "trunk_cap",
            lambda: weighted_sum(
                self.member_trunk, self.link_cap()[self.member_link], len(self.trunk_names)
            ),
        )

    def trunk_extra_latency(self) -> FloatArray:
        """The largest added latency among a trunk's live members (data is sprayed over all)."""

        def compute() -> FloatArray:
            out = np.zeros(len(self.trunk_names))
            live = self.up[self.member_link]
            lat = self.extra_latency_s[self.member_link[live]]
            np.maximum.at(out, self.member_trunk[live], lat)
            return out

        return self._derived("trunk_extra_latency", compute)

    # --- endpoints and routes ----------------------------------------------------------------

    def _plane_of(self, link: int) -> int:
        a, b = self.names[link].split(">")
        switch = b if "-l1s" in b else a
        return int(switch.rsplit("l1s", 1)[1])

    def _ports(self, links: list[int]) -> tuple[tuple[int, ...], ...]:
        per_plane: list[list[int]] = [[] for _ in range(self.planes)]
        for i in links:
            per_plane[self._plane_of(i)].append(i)
        return tuple(tuple(p) for p in per_plane)

    def _build_endpoints(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        profile = self.profile
        port_kinds = (LinkKind.DIE_PORT, LinkKind.CPU_PORT)

        def ports(name: str, table: dict[str, list[int]]) -> tuple[tuple[int, ...], ...]:
            return self._ports([i for i in table[name] if self.kinds[i] in port_kinds])

        for d in self.topology.devices:
            if d.kind is DeviceKind.NPU:
                for die in range(profile.npu.dies):
                    name = die_port(d.id, die)
                    self.endpoints[name] = Endpoint(
                        name=name,
                        device=d,
                        out=((self.trunk(f"{name}:out"), 1.0),),
                        inn=((self.trunk(f"{name}:in"), 1.0),),
                        out_ports=ports(name, self._outgoing),
                        in_ports=ports(name, self._incoming),
                        local_bytes_per_s=profile.npu.hbm_bytes_per_s_per_die,
                    )
            elif d.kind is DeviceKind.CPU:
                self.endpoints[d.id] = Endpoint(
                    name=d.id,
                    device=d,
                    out=((self.trunk(f"{d.id}:out"), 1.0),),
                    inn=((self.trunk(f"{d.id}:in"), 1.0),),
                    out_ports=ports(d.id, self._outgoing),
                    in_ports=ports(d.id, self._incoming),
                    local_bytes_per_s=profile.cpu.ub_bytes_per_s,
                )
        for d in self.topology.of_kind(DeviceKind.MEMPOOL):
            cpus = [
                self.endpoints[c.id]
                for c in self.topology.in_node(d.node)
                if c.kind is DeviceKind.CPU
            ]
            share = 1.0 / len(cpus)
            self.endpoints[d.id] = Endpoint(
                name=d.id,
                device=d,
                out=((self.trunk(f"{d.id}:out"), 1.0), *((c.out[0][0], share) for c in cpus)),
                inn=((self.trunk(f"{d.id}:in"), 1.0), *((c.inn[0][0], share) for c in cpus)),
                out_ports=tuple(
                    tuple(i for c in cpus for i in c.out_ports[p]) for p in range(self.planes)
                ),
                in_ports=tuple(
                    tuple(i for c in cpus for i in c.in_ports[p]) for p in range(self.planes)
                ),
                local_bytes_per_s=profile.cpu.ub_bytes_per_s * len(cpus),
            )

    def endpoint(self, name: str) -> Endpoint:
        """A device id, or an NPU die "n00-npu3.d1"; a bare NPU id means its die 0."""
        if name in self.endpoints:
            return self.endpoints[name]
        device = self.topology.device(name.split(".", 1)[0])
        if device.kind is DeviceKind.NPU and "." not in name:
            return self.endpoints[die_port(device.id, 0)]
        raise OutOfRangeError(
            f"{name!r} is not an endpoint; NPU dies are .d0 to .d{self.profile.npu.dies - 1}"
        )

    def npu_die(self, device: Device, die: int) -> Endpoint:
        if die >= self.profile.npu.dies:
            raise OutOfRangeError(f"die {die} does not exist; an NPU has {self.profile.npu.dies}")
        return self.endpoints[die_port(device.id, die)]

    def partitioned(self, a: str, b: str) -> bool:
        return any((a in x and b in y) or (a in y and b in x) for x, y in self.partitions)

    def _plane_caps(self, links: tuple[tuple[int, ...], ...], cap: FloatArray) -> FloatArray:
        return np.array([cap[list(p)].sum() if p else 0.0 for p in links])

    def _uplink(
        self, node: str, plane: int, cap: FloatArray, *, down: bool
    ) -> tuple[float, list[int]]:
        table = self._incoming if down else self._outgoing
        links = [i for i in table[l1_switch(node, plane)] if self.kinds[i] is LinkKind.L1_L2]
        live = [i for i in links if cap[i] > 0]
        return (max(cap[i] for i in live) if live else 0.0), live

    def route(self, src: Endpoint, dst: Endpoint) -> Route:
        """The route and its uncontended ceiling; UnavailableError when nothing connects them.
        Routes are cached until the live state changes (a fault), as a switch's tables are."""
        key = (src.name, dst.name)
        route = self._routes.get(key)
        if route is None:
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            route = self._routes[key] = self._route(src, dst)
        return route

    def _route(self, src: Endpoint, dst: Endpoint) -> Route:
        if self.partitioned(src.device.id, dst.device.id):
            raise UnavailableError(f"{src.device.id} and {dst.device.id} are partitioned")
        endpoint_s = endpoint_latency_s(self.profile)
        if src.name == dst.name:
            return Route(
                resources=(),
                cap=src.local_bytes_per_s,
                latency_s=endpoint_s,
                hops=(src.name,),
                planes=0,
            )
        cap = self.link_cap()
        extra = self.trunk_extra_latency()
        sibling = f"{src.name}>{dst.name}"
        if sibling in self._index and self.kinds[self._index[sibling]] is LinkKind.DIE_TO_DIE:
            trunk = self.trunk(sibling)
            if cap[self._index[sibling]] <= 0:
                raise UnavailableError(f"die-to-die link {sibling} is down")
            return Route(
                resources=((trunk, 1.0),),
                cap=float(cap[self._index[sibling]]),
                latency_s=endpoint_s + float(extra[trunk]),
                hops=(src.name, dst.name),
                planes=0,
            )
        per_plane = np.minimum(
            self._plane_caps(src.out_ports, cap), self._plane_caps(dst.in_ports, cap)
        )
        src_node, dst_node = src.device.node, dst.device.node
        resources = list(src.out)
        chips: dict[int, int] = {}
        if src_node != dst_node:
            up_trunk, down_trunk = self.trunk(f"{src_node}:up"), self.trunk(f"{dst_node}:down")
            resources += [(up_trunk, 1.0), (down_trunk, 1.0)]
            for p in range(self.planes):
                up_cap, up_live = self._uplink(src_node, p, cap, down=False)
                down_cap, down_live = self._uplink(dst_node, p, cap, down=True)
                up_chips = {self.names[i].split(">")[1] for i in up_live}
                common = sorted(up_chips & {self.names[i].split(">")[0] for i in down_live})
                if not common:
                    per_plane[p] = 0.0
                    continue
                per_plane[p] = min(per_plane[p], up_cap, down_cap)
                pick = zlib.crc32(f"{src.name}>{dst.name}".encode()) % len(common)  # ECMP hash
                chips[p] = int(common[pick].rsplit("-s", 1)[1])
        resources += list(dst.inn)
        usable = [p for p in range(self.planes) if per_plane[p] > 0]
        if not usable:
            raise UnavailableError(f"no live UB plane connects {src.name} and {dst.name}")
        first = usable[0]
        if src_node == dst_node:
            hops: tuple[str, ...] = (src.name, l1_switch(src_node, first), dst.name)
            switches = 1
        else:
            hops = (
                src.name,
                l1_switch(src_node, first),
                l2_switch(first, chips[first]),
                l1_switch(dst_node, first),
                dst.name,
            )
            switches = 3
        latency = endpoint_s + switches * hop_latency_s(self.profile)
        latency += float(sum(extra[t] for t, _ in resources))
        return Route(
            resources=tuple(resources),
            cap=float(per_plane.sum()),
            latency_s=latency,
            hops=hops,
            planes=len(usable),
        )

    def check_reachable(self, route: Route) -> None:
        caps = self.trunk_cap()
        dead = [self.trunk_names[t] for t, _ in route.resources if caps[t] <= 0]
        if dead:
            raise UnavailableError(f"no capacity left on {', '.join(dead)}")


def validate_ranks(graph: LinkGraph, ranks: Iterable[str]) -> list[Endpoint]:
    """Collective ranks: NPU dies; a bare NPU id stands for all its dies. No duplicates."""
    out: list[Endpoint] = []
    for rank in ranks:
        device = graph.topology.device(rank.split(".", 1)[0])
        if device.kind is not DeviceKind.NPU:
            raise InvalidArgumentError(
                f"rank {rank!r}: collectives run on NPU dies, not on a {device.kind.value}"
            )
        if "." in rank:
            out.append(graph.endpoint(rank))
        else:
            out += [graph.npu_die(device, die) for die in range(graph.profile.npu.dies)]
    names = [e.name for e in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgumentError(f"ranks repeat: {', '.join(duplicates)}")
    if len(out) < 2:
        raise InvalidArgumentError("a collective needs at least 2 ranks")
    return out
