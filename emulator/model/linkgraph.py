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

import dataclasses
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from emulator.model.costmodel import (
    UbOp,
    endpoint_latency_s,
    hop_latency_s,
    ub_efficiency,
    ub_latency_s,
    ub_wire_cost,
)
from emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
    quote,
)
from emulator.model.flowsim import weighted_sum
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.naming import (
    DieName,
    Tier,
    die_id,
    directed_link_id,
    parse_endpoint,
    parse_link,
    parse_switch,
    trunk_id,
)
from emulator.model.topology import Device, DeviceKind, LinkKind, Topology

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Incidence = tuple[tuple[int, float], ...]  # (trunk index, share of the flow that crosses it)
ROUTE_CACHE_MAX = 200_000


class RouteKind(StrEnum):
    """What a route crosses, which decides its fixed latency (LinkGraph.base_latency_s)."""

    LOCAL = "local"  # an endpoint to itself: an HBM or DRAM copy
    SIBLING = "sibling"  # the two dies of one NPU package, over their die-to-die link
    SAME_NODE = "same-node"  # through one L1 chip on each plane
    CROSS_NODE = "cross-node"  # L1, L2, L1 on each plane


SWITCH_HOPS = {
    RouteKind.LOCAL: 0,
    RouteKind.SIBLING: 0,
    RouteKind.SAME_NODE: 1,
    RouteKind.CROSS_NODE: 3,
}


def l2_plane_caps(up: FloatArray, down: FloatArray) -> FloatArray:
    """Per plane, the ceiling of a flow across the L2 tier: one L1->L2 link out of the source
    node and one L2->L1 link into the destination node, through the best L2 chip live on both
    (0 where no chip is). Chips on the last axis, planes before; other axes broadcast."""
    best: FloatArray = np.minimum(up, down).max(axis=-1)
    return best


def flow_plane_caps(
    src_ports: FloatArray, dst_ports: FloatArray, l2: FloatArray | None = None
) -> FloatArray:
    """Per plane, a flow's own ceiling: a plane carries it only where both ends have live ports
    on it (and, across nodes, the L2 tier connects them: `l2`, from l2_plane_caps). Planes on the
    last axis; a flow's ceiling is the sum over its planes."""
    caps: FloatArray = np.minimum(src_ports, dst_ports)
    return caps if l2 is None else np.minimum(caps, l2)


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where a flow starts or ends: an NPU die, a CPU, or a memory pool."""

    name: str
    row: int  # its row in LinkGraph.port_caps()
    device: Device
    out: Incidence
    inn: Incidence
    out_ports: tuple[tuple[int, ...], ...]  # per plane: the directed links leaving on it
    in_ports: tuple[tuple[int, ...], ...]
    local_bytes_per_s: float  # a transfer to itself: HBM or DRAM copy


@dataclass(frozen=True, kw_only=True)
class Route:
    kind: RouteKind
    resources: Incidence
    cap: float  # the flow's own ceiling, bytes/s
    latency_s: float
    hops: tuple[str, ...]
    planes: int


class LinkGraph:
    """The one router: LinkGraph.route for one transfer, and for collectives the same rules in
    array form (port_caps, l2_caps, die_link, base_latency_s, with l2_plane_caps and
    flow_plane_caps), which collectives.DieFlows applies to 100,000 pairs at once."""

    def __init__(self, topology: Topology, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.topology = topology
        self.profile = profile
        self.version = 0  # of the live state: a timing computed at one version holds for it
        self.planes = profile.switch.l2_planes
        self.chips = profile.switch.l2_chips_per_plane
        self.names: list[str] = []  # directed links, "a>b"
        self.kinds: list[LinkKind] = []
        self.ends: list[tuple[str, str]] = []
        self._index: dict[str, int] = {}
        self._physical: dict[tuple[str, str], tuple[int, int]] = {}
        self._by_switch: dict[str, list[int]] = defaultdict(list)
        raw: list[float] = []
        eff = ub_efficiency(profile)
        loss = profile.ub.cross_node_bandwidth_loss
        # A socket's UB ports carry its published 160 GB/s one way as reads of its memory, and
        # such a read costs ub_wire_cost(READ, CPU) link bytes per payload byte on each trunk it
        # crosses: its ports are that many link bytes wide, not derated by the dies' port
        # efficiency (a die's 151 GB/s read of CPU memory is more than 160 x that efficiency).
        cpu_scale = ub_wire_cost(UbOp.READ, DeviceKind.CPU, profile)
        for link in topology.links:
            if link.kind in (LinkKind.CPU_PORT, LinkKind.POOL):
                scale = cpu_scale
            else:
                scale = eff * ((1 - loss) if link.kind is LinkKind.L1_L2 else 1.0)
            pair = []
            for a, b in ((link.a, link.b), (link.b, link.a)):
                name = directed_link_id(a, b)
                self._index[name] = len(self.names)
                pair.append(len(self.names))
                self.names.append(name)
                self.kinds.append(link.kind)
                self.ends.append((a, b))
                raw.append(link.bytes_per_s * scale)
            self._physical[(link.a, link.b)] = self._physical[(link.b, link.a)] = (pair[0], pair[1])
            for end in (link.a, link.b):
                self._by_switch[end].extend(pair)
        self.base_cap = np.array(raw)
        self.node_row = {node: i for i, node in enumerate(topology.nodes)}
        self._switches = {s.id: parse_switch(s.id) for s in topology.switches}
        self.reset()
        self._build_trunks()
        self._build_endpoints()
        self._build_l2_tables()

    # --- live state --------------------------------------------------------------------------

    def reset(self) -> None:
        """Every link up, at full bandwidth, with no added latency."""
        n = len(self.names)
        self.up = np.ones(n, dtype=bool)
        self.factor = np.ones(n)
        self.extra_latency_s = np.zeros(n)
        # (side a, side b, one way): one way, only a's frames to b are lost
        self.partitions: list[tuple[frozenset[str], frozenset[str], bool]] = []
        self.invalidate()

    def invalidate(self) -> None:
        """Forget everything derived from the live state; whoever mutates it calls this."""
        self.version += 1
        self._cache: dict[str, FloatArray] = {}
        self._routes: dict[tuple[str, str], Route] = {}

    def _derived(self, name: str, compute: Callable[[], FloatArray]) -> FloatArray:
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def link_cap(self) -> FloatArray:
        return self._derived("link_cap", lambda: self.base_cap * self.factor * self.up)

    def physical(self, link: str) -> tuple[int, int]:
        """Both directions of a physical link, named as naming.py spells links: "a~b" (either
        order) or one of its directions "a>b", as the link statistics print them."""
        name = parse_link(link)
        pair = self._physical.get((name.a, name.b))
        if pair is None:
            raise NotFoundError(
                f"no link {quote(link)}; a link is 'a~b' or 'a>b'"
                " (cmemu links, cmemu topology --json)",
                subject=link,
                reason="LINK_NOT_FOUND",
            )
        return pair

    def switch_links(self, switch_id: str) -> list[int]:
        parse_switch(switch_id)
        if switch_id not in self._switches:
            raise NotFoundError(
                f"no switch {quote(switch_id)}", subject=switch_id, reason="SWITCH_NOT_FOUND"
            )
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
        outgoing: dict[str, list[int]] = defaultdict(list)
        incoming: dict[str, list[int]] = defaultdict(list)
        for i, (a, b) in enumerate(self.ends):
            outgoing[a].append(i)
            incoming[b].append(i)
        for i, name in enumerate(self.names):
            if self.kinds[i] is LinkKind.DIE_TO_DIE:
                self._trunk(name, [i])
        # An endpoint's trunk is its links into the switch layer (a pool's: to its CPUs); a
        # CPU's link to the pool belongs to the pool's trunk, not to the CPU's UB ports.
        own = {
            DeviceKind.NPU: LinkKind.DIE_PORT,
            DeviceKind.CPU: LinkKind.CPU_PORT,
            DeviceKind.MEMPOOL: LinkKind.POOL,
        }
        endpoints = [
            (die_id(d.id, die), d.kind)
            for d in self.topology.of_kind(DeviceKind.NPU)
            for die in range(self.profile.npu.dies)
        ] + [(d.id, d.kind) for d in self.topology.devices if d.kind is not DeviceKind.NPU]
        for ep, kind in endpoints:
            link_kind = own[kind]
            self._trunk(
                trunk_id(ep, "out"), [i for i in outgoing[ep] if self.kinds[i] is link_kind]
            )
            self._trunk(trunk_id(ep, "in"), [i for i in incoming[ep] if self.kinds[i] is link_kind])
        l1_of_node: dict[str, list[str]] = defaultdict(list)
        for switch in self.topology.switches:
            if switch.node is not None:
                l1_of_node[switch.node].append(switch.id)
        for node in self.topology.nodes:
            l1s = l1_of_node[node]
            self._trunk(
                trunk_id(node, "up"),
                [i for s in l1s for i in outgoing[s] if self.kinds[i] is LinkKind.L1_L2],
            )
            self._trunk(
                trunk_id(node, "down"),
                [i for s in l1s for i in incoming[s] if self.kinds[i] is LinkKind.L1_L2],
            )
        self.member_link = np.array(self._member_link, dtype=np.int64)
        self.member_trunk = np.array(self._member_trunk, dtype=np.int64)
        self._outgoing, self._incoming = outgoing, incoming

    def trunk(self, name: str) -> int:
        return self._trunk_index[name]

    def uplink_trunk(self, node: str) -> int:
        """The trunk of a node's L1->L2 links, all planes."""
        return self._trunk_index[trunk_id(node, "up")]

    def downlink_trunk(self, node: str) -> int:
        """The trunk of a node's L2->L1 links, all planes."""
        return self._trunk_index[trunk_id(node, "down")]

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

    # --- endpoints -----------------------------------------------------------------------------

    def _plane_of(self, link: int) -> int:
        """The UB plane of a port: that of the L1 chip at its switch end."""
        a, b = self.ends[link]
        switch = self._switches.get(b) or self._switches[a]
        return switch.plane

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

        def add(name: str, device: Device, local_bytes_per_s: float) -> None:
            self.endpoints[name] = Endpoint(
                name=name,
                row=len(self.endpoints),
                device=device,
                out=((self.trunk(trunk_id(name, "out")), 1.0),),
                inn=((self.trunk(trunk_id(name, "in")), 1.0),),
                out_ports=ports(name, self._outgoing),
                in_ports=ports(name, self._incoming),
                local_bytes_per_s=local_bytes_per_s,
            )

        for d in self.topology.devices:
            if d.kind is DeviceKind.NPU:
                for die in range(profile.npu.dies):
                    add(die_id(d.id, die), d, profile.npu.hbm_bytes_per_s_per_die)
            elif d.kind is DeviceKind.CPU:
                add(d.id, d, profile.cpu.ub_bytes_per_s)
        for d in self.topology.of_kind(DeviceKind.MEMPOOL):
            cpus = [
                self.endpoints[c.id]
                for c in self.topology.in_node(d.node)
                if c.kind is DeviceKind.CPU
            ]
            share = 1.0 / len(cpus)
            self.endpoints[d.id] = Endpoint(
                name=d.id,
                row=len(self.endpoints),
                device=d,
                out=(
                    (self.trunk(trunk_id(d.id, "out")), 1.0),
                    *((c.out[0][0], share) for c in cpus),
                ),
                inn=(
                    (self.trunk(trunk_id(d.id, "in")), 1.0),
                    *((c.inn[0][0], share) for c in cpus),
                ),
                out_ports=tuple(
                    tuple(i for c in cpus for i in c.out_ports[p]) for p in range(self.planes)
                ),
                in_ports=tuple(
                    tuple(i for c in cpus for i in c.in_ports[p]) for p in range(self.planes)
                ),
                local_bytes_per_s=profile.cpu.ub_bytes_per_s * len(cpus),
            )
        # every port as (cell: endpoint row * planes + plane, directed link), out and in
        cells: tuple[list[int], list[int]] = ([], [])
        links: tuple[list[int], list[int]] = ([], [])
        for e in self.endpoints.values():
            for side, table in enumerate((e.out_ports, e.in_ports)):
                for plane, members in enumerate(table):
                    cells[side].extend([e.row * self.planes + plane] * len(members))
                    links[side].extend(members)
        self._port_cell = [np.array(c, dtype=np.int64) for c in cells]
        self._port_link = [np.array(x, dtype=np.int64) for x in links]

    def _build_l2_tables(self) -> None:
        """Per node, plane and L2 chip: the directed L1->L2 link (up) and L2->L1 link (down)."""
        shape = (len(self.topology.nodes), self.planes, self.chips)
        up = np.full(shape, -1, dtype=np.int64)
        down = np.full(shape, -1, dtype=np.int64)
        for i, (a, b) in enumerate(self.ends):
            if self.kinds[i] is not LinkKind.L1_L2:
                continue
            l1, l2, table = (a, b, up) if self._switches[a].tier is Tier.L1 else (b, a, down)
            chip = self._switches[l2]
            node = self._switches[l1].node_id
            assert node is not None
            table[self.node_row[node], chip.plane, chip.chip] = i
        self._l2_links = (up, down)
        self._l2_ids = {(s.plane, s.chip): i for i, s in self._switches.items() if s.node is None}
        self._l1_ids = {
            (s.node_id, s.plane): i for i, s in self._switches.items() if s.node is not None
        }

    def endpoint(self, name: str) -> Endpoint:
        """A device id, or an NPU die "n00-npu3.d1"; a bare NPU id means its die 0."""
        if name in self.endpoints:
            return self.endpoints[name]
        parsed = parse_endpoint(name)
        if isinstance(parsed, DieName):
            self.topology.device(parsed.device.id)
            raise OutOfRangeError(
                f"{quote(name)}: NPU dies are .d0 to .d{self.profile.npu.dies - 1}", subject=name
            )
        device = self.topology.device(parsed.id)
        return self.endpoints[die_id(device.id, 0)]

    def npu_die(self, device: Device, die: int) -> Endpoint:
        if die >= self.profile.npu.dies:
            raise OutOfRangeError(f"die {die} does not exist; an NPU has {self.profile.npu.dies}")
        return self.endpoints[die_id(device.id, die)]

    def partitioned(self, a: str, b: str) -> bool:
        """Whether frames from device `a` to device `b` are lost (a partition, either way, or
        one way from a's side to b's)."""
        return any(
            (a in x and b in y) or (not one_way and a in y and b in x)
            for x, y, one_way in self.partitions
        )

    # --- the routing rules, as arrays over the live state ------------------------------------

    def port_caps(self, *, inbound: bool = False) -> FloatArray:
        """Per endpoint (rows: Endpoint.row) and plane, the live capacity of its UB ports out of
        it (inbound: into it)."""
        side = int(inbound)

        def compute() -> FloatArray:
            n = len(self.endpoints) * self.planes
            caps = weighted_sum(self._port_cell[side], self.link_cap()[self._port_link[side]], n)
            return caps.reshape(len(self.endpoints), self.planes)

        return self._derived(f"port_caps_{side}", compute)

    def l2_caps(self, *, down: bool = False) -> FloatArray:
        """Per node (rows: node_row), plane and L2 chip, the live capacity of the node's L1->L2
        link (down: L2->L1); 0 where it is down."""
        links = self._l2_links[int(down)]

        def compute() -> FloatArray:
            caps: FloatArray = np.where(links >= 0, self.link_cap()[links], 0.0)
            return caps

        return self._derived(f"l2_caps_{int(down)}", compute)

    def die_link(self, src: Endpoint, dst: Endpoint) -> tuple[int, float] | None:
        """The die-to-die trunk from one die of a package to its sibling, with its live
        capacity; None unless the two are dies joined by a die-to-die link."""
        if src.device.id != dst.device.id or src.name == dst.name:
            return None
        link = self._index.get(directed_link_id(src.name, dst.name))
        if link is None or self.kinds[link] is not LinkKind.DIE_TO_DIE:
            return None
        return self.trunk(self.names[link]), float(self.link_cap()[link])

    def route_kind(self, src: Endpoint, dst: Endpoint) -> RouteKind:
        if src.name == dst.name:
            return RouteKind.LOCAL
        if self.die_link(src, dst) is not None:
            return RouteKind.SIBLING
        if src.device.node == dst.device.node:
            return RouteKind.SAME_NODE
        return RouteKind.CROSS_NODE

    def base_latency_s(self, kind: RouteKind) -> float:
        """The fixed latency of a route of this kind, before any added by a fault: the endpoint
        cost and one hop per switch crossed."""
        return endpoint_latency_s(self.profile) + SWITCH_HOPS[kind] * hop_latency_s(self.profile)

    # --- routes ------------------------------------------------------------------------------

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
        kind = self.route_kind(src, dst)
        extra = self.trunk_extra_latency()
        if kind is RouteKind.LOCAL:
            return Route(
                kind=kind,
                resources=(),
                cap=src.local_bytes_per_s,
                latency_s=self.base_latency_s(kind),
                hops=(src.name,),
                planes=0,
            )
        if kind is RouteKind.SIBLING:
            link = self.die_link(src, dst)
            assert link is not None
            trunk, cap = link
            if cap <= 0:
                raise UnavailableError(
                    f"die-to-die link {directed_link_id(src.name, dst.name)} is down"
                )
            return Route(
                kind=kind,
                resources=((trunk, 1.0),),
                cap=cap,
                latency_s=self.base_latency_s(kind) + float(extra[trunk]),
                hops=(src.name, dst.name),
                planes=0,
            )
        src_node, dst_node = src.device.node, dst.device.node
        resources = [*src.out]
        l2: FloatArray | None = None
        if kind is RouteKind.CROSS_NODE:
            resources += [(self.uplink_trunk(src_node), 1.0), (self.downlink_trunk(dst_node), 1.0)]
            up = self.l2_caps()[self.node_row[src_node]]
            down = self.l2_caps(down=True)[self.node_row[dst_node]]
            l2 = l2_plane_caps(up, down)
        resources += dst.inn
        per_plane = flow_plane_caps(
            self.port_caps()[src.row], self.port_caps(inbound=True)[dst.row], l2
        )
        usable = np.flatnonzero(per_plane > 0)
        if not len(usable):
            raise UnavailableError(f"no live UB plane connects {src.name} and {dst.name}")
        first = int(usable[0])
        hops: tuple[str, ...]
        if kind is RouteKind.SAME_NODE:
            hops = (src.name, self._l1_ids[(src_node, first)], dst.name)
        else:
            # ECMP: a flow is hashed to one of the plane's L2 chips live on both sides
            both = np.minimum(up[first], down[first])
            common = np.flatnonzero(both > 0)
            pick = zlib.crc32(directed_link_id(src.name, dst.name).encode()) % len(common)
            hops = (
                src.name,
                self._l1_ids[(src_node, first)],
                self._l2_ids[(first, int(common[pick]))],
                self._l1_ids[(dst_node, first)],
                dst.name,
            )
        latency = self.base_latency_s(kind) + float(sum(extra[t] for t, _ in resources))
        return Route(
            kind=kind,
            resources=tuple(resources),
            cap=float(per_plane.sum()),
            latency_s=latency,
            hops=hops,
            planes=len(usable),
        )

    def priced(self, route: Route, op: UbOp, target: DeviceKind) -> Route:
        """The route as one transaction sees it: routes (and collectives) are priced as the
        reference NPU -> NPU read; a transaction of another op, or against CPU memory, takes
        its own latency and occupies every trunk it crosses at its own cost per byte
        (costmodel.ub_wire_cost), so that alone it achieves its calibrated bandwidth."""
        cost = ub_wire_cost(op, target, self.profile)
        extra = ub_latency_s(op, target, self.profile) - ub_latency_s(profile=self.profile)
        if cost == 1.0 and extra == 0.0:
            return route
        return dataclasses.replace(
            route,
            resources=tuple((t, w * cost) for t, w in route.resources),
            cap=route.cap / cost,
            latency_s=route.latency_s + extra,
        )

    def check_reachable(self, route: Route) -> None:
        caps = self.trunk_cap()
        dead = [self.trunk_names[t] for t, _ in route.resources if caps[t] <= 0]
        if dead:
            raise UnavailableError(f"no capacity left on {', '.join(dead)}")


def validate_ranks(graph: LinkGraph, ranks: Iterable[str]) -> list[Endpoint]:
    """Collective ranks: NPU dies; a bare NPU id stands for all its dies. No duplicates.
    Linear in the number of ranks, and at most every die of the topology is looked at."""
    dies = graph.profile.npu.dies
    most = sum(1 for d in graph.topology.devices if d.kind is DeviceKind.NPU) * dies
    out: list[Endpoint] = []
    seen: set[str] = set()
    for rank in ranks:
        parsed = parse_endpoint(rank)
        device = graph.topology.device(
            parsed.device.id if isinstance(parsed, DieName) else parsed.id
        )
        if device.kind is not DeviceKind.NPU:
            raise InvalidArgumentError(
                f"rank {quote(rank)}: collectives run on NPU dies, not on a {device.kind.value}",
                subject=rank,
            )
        if isinstance(parsed, DieName):
            found = [graph.endpoint(rank)]
        else:
            found = [graph.npu_die(device, die) for die in range(dies)]
        for endpoint in found:
            if endpoint.name in seen:
                raise InvalidArgumentError(
                    f"ranks repeat: {quote(endpoint.name)}", subject=endpoint.name
                )
            seen.add(endpoint.name)
        out += found
        if len(out) > most:  # pragma: no cover - a repeat is found first
            raise InvalidArgumentError(f"more ranks than the {most} NPU dies of the topology")
    if len(out) < 2:
        raise InvalidArgumentError("a collective needs at least 2 ranks")
    return out
