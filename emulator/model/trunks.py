"""The link graph's trunks: groups of parallel directed links that a flow shares as one resource.

A transfer is striped over the UB planes and sprayed over a plane's L2 chips, so the flow model
shares trunks, not single links; which links make up which trunk is fixed by the topology and
built once here, while their live capacity is LinkGraph's (trunk_cap, the sum of live members).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import die_id, trunk_id
from cmemu.emulator.model.topology import DeviceKind, LinkKind, Topology

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class Trunks:
    """Every trunk by name and index, and its members as two parallel arrays (member_link,
    member_trunk), with the directed links leaving and entering each device or switch."""

    names: list[str]
    index: dict[str, int]
    member_link: IntArray
    member_trunk: IntArray
    outgoing: dict[str, list[int]]
    incoming: dict[str, list[int]]


def build_trunks(
    topology: Topology,
    profile: HardwareProfile,
    *,
    names: Sequence[str],
    kinds: Sequence[LinkKind],
    ends: Sequence[tuple[str, str]],
) -> Trunks:
    """The trunks of a graph whose directed links are `names`, with their kinds and ends:

    - each die-to-die link, alone;
    - an endpoint's links into the switch layer (a pool's: to its CPUs), out and in;
    - a node's L1->L2 uplinks (and downlinks), all planes.
    """
    trunk_names: list[str] = []
    index: dict[str, int] = {}
    member_link: list[int] = []
    member_trunk: list[int] = []

    def add(name: str, members: Iterable[int]) -> None:
        trunk = len(trunk_names)
        trunk_names.append(name)
        index[name] = trunk
        for m in members:
            member_link.append(m)
            member_trunk.append(trunk)

    outgoing: dict[str, list[int]] = defaultdict(list)
    incoming: dict[str, list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(ends):
        outgoing[a].append(i)
        incoming[b].append(i)
    for i, name in enumerate(names):
        if kinds[i] is LinkKind.DIE_TO_DIE:
            add(name, [i])
    # An endpoint's trunk is its links into the switch layer (a pool's: to its CPUs); a
    # CPU's link to the pool belongs to the pool's trunk, not to the CPU's UB ports.
    own = {
        DeviceKind.NPU: LinkKind.DIE_PORT,
        DeviceKind.CPU: LinkKind.CPU_PORT,
        DeviceKind.MEMPOOL: LinkKind.POOL,
    }
    endpoints = [
        (die_id(d.id, die), d.kind)
        for d in topology.of_kind(DeviceKind.NPU)
        for die in range(profile.npu.dies)
    ] + [(d.id, d.kind) for d in topology.devices if d.kind is not DeviceKind.NPU]
    for ep, kind in endpoints:
        link_kind = own[kind]
        add(trunk_id(ep, "out"), [i for i in outgoing[ep] if kinds[i] is link_kind])
        add(trunk_id(ep, "in"), [i for i in incoming[ep] if kinds[i] is link_kind])
    l1_of_node: dict[str, list[str]] = defaultdict(list)
    for switch in topology.switches:
        if switch.node is not None:
            l1_of_node[switch.node].append(switch.id)
    for node in topology.nodes:
        l1s = l1_of_node[node]
        add(
            trunk_id(node, "up"),
            [i for s in l1s for i in outgoing[s] if kinds[i] is LinkKind.L1_L2],
        )
        add(
            trunk_id(node, "down"),
            [i for s in l1s for i in incoming[s] if kinds[i] is LinkKind.L1_L2],
        )
    return Trunks(
        names=trunk_names,
        index=index,
        member_link=np.array(member_link, dtype=np.int64),
        member_trunk=np.array(member_trunk, dtype=np.int64),
        outgoing=outgoing,
        incoming=incoming,
    )
