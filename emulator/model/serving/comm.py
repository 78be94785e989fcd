"""What the simulator answers for the communication the engine asks about, from pure models:

- MoE dispatch and combine: on `cm384` the fabric's own collective (run_collective on the
  topology's link graph, the same algorithm the live fabric runs), memoised by shape; on
  `cluster-roce` each rank's traffic leaving its 8-NPU server goes over RDMA at the profile's
  rate per die, the rest over UB inside the server.
- the prefill -> decode KV transfer: the UB cost model (die to die), or RDMA between servers on
  `cluster-roce`.

Model mode only: the live fabric has no RDMA plane yet, so `cluster-roce` exists only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, cached_property

from cmemu.emulator.model.collectives import run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.costmodel import (
    NS,
    endpoint_bytes_per_s,
    moe_bytes_per_token,
    moe_overhead_s,
    ub_base_latency_s,
    ub_transfer_ns,
)
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
from cmemu.emulator.model.naming import DieName, parse_endpoint
from cmemu.emulator.model.serving.deployment import PLATFORMS
from cmemu.emulator.model.topology import DeviceKind, Topology, build


class CommModel:
    def __init__(
        self, topology: Topology, platform: str, profile: HardwareProfile = DEFAULT_PROFILE
    ) -> None:
        self.topology = topology
        self.platform = PLATFORMS[platform]
        self.profile = profile
        self._moe: dict[tuple[tuple[str, ...], int], tuple[float, float]] = {}
        self._kv: dict[tuple[int, str, str], float] = {}

    @cached_property
    def graph(self) -> LinkGraph:
        return LinkGraph(self.topology, self.profile)

    def moe(self, ranks: Sequence[str], tokens_per_rank: int) -> tuple[float, float]:
        """(dispatch_s, combine_s): one collective each over `ranks` (die ids)."""
        key = (tuple(ranks), tokens_per_rank)
        found = self._moe.get(key)
        if found is None:
            if self.platform.ub_across_servers:
                found = self._fabric(list(ranks), tokens_per_rank)
            else:
                found = self._roce(list(ranks), tokens_per_rank)
            self._moe[key] = found
        return found

    def _fabric(self, ranks: list[str], tokens: int) -> tuple[float, float]:
        endpoints = validate_ranks(self.graph, ranks)
        dispatch, combine = (
            run_collective(
                self.graph, endpoints, CollectiveSpec(op=op, tokens_per_rank=tokens)
            ).duration_s
            for op in ("moe-dispatch", "moe-combine")
        )
        return dispatch, combine

    def _roce(self, ranks: list[str], tokens: int) -> tuple[float, float]:
        """Every rank sends an even share of its token copies to every rank: the shares for
        ranks in its own server cross UB, the others leave over its RDMA port; the slower of
        the two, plus latency and the fitted software overhead of the op."""
        p = self.profile
        server = [self._server(r) for r in ranks]
        n = len(ranks)
        local = max(server.count(s) for s in set(server))
        remote_share = (n - local) / n
        ub_share = (local - 1) / n
        rdma = p.npu.rdma_bytes_per_s_per_die * p.scaleout.efficiency
        out: list[float] = []
        for op in ("dispatch", "combine"):
            sent = tokens * p.moe.top_k * moe_bytes_per_token(op, p)
            ub = sent * ub_share / endpoint_bytes_per_s(DeviceKind.NPU, p)
            net = sent * remote_share / rdma
            latency = ub_base_latency_s(p) + (p.scaleout.latency_s(switches=3) if net else 0.0)
            out.append(latency + max(ub, net) + moe_overhead_s(op, p, ranks=n))
        return out[0], out[1]

    def _server(self, die: str) -> int:
        return _node(die)

    def kv_transfer_s(self, nbytes: int, src_npu: str, dst_npu: str) -> float:
        """One request's KV from a prefill die to a decode die."""
        key = (nbytes, src_npu, dst_npu)
        found = self._kv.get(key)
        if found is None:
            found = self._kv[key] = self._kv_transfer_s(nbytes, src_npu, dst_npu)
        return found

    def _kv_transfer_s(self, nbytes: int, src_npu: str, dst_npu: str) -> float:
        s_node, d_node = _node(src_npu), _node(dst_npu)
        if s_node == d_node or self.platform.ub_across_servers:
            return (
                ub_transfer_ns(
                    nbytes,
                    src=DeviceKind.NPU,
                    dst=DeviceKind.NPU,
                    cross_node=s_node != d_node,
                    profile=self.profile,
                )
                / NS
            )
        p = self.profile
        rdma = p.npu.rdma_bytes_per_s_per_die * p.scaleout.efficiency
        return p.scaleout.latency_s(switches=3) + ub_base_latency_s(p) + nbytes / rdma


def _node(name: str) -> int:
    """The node (an 8-NPU server) of an NPU or die id."""
    parsed = parse_endpoint(name)
    return parsed.device.node if isinstance(parsed, DieName) else parsed.node


@cache
def _default_topology(preset: str) -> Topology:
    return build(preset)


_TOPOLOGIES: dict[tuple[str, int], tuple[HardwareProfile, Topology]] = {}
_COMMS: dict[tuple[int, str, int], tuple[Topology, HardwareProfile, CommModel]] = {}


def topology_for(preset: str, profile: HardwareProfile = DEFAULT_PROFILE) -> Topology:
    """The preset built on `profile`: its links carry the profile's port bandwidths, so a
    what-if on `switch.port_bytes_per_s` or `npu.ub_port_bytes_per_s` reaches the collectives
    (the ports keep the measured protocol efficiency: costmodel.ub_efficiency)."""
    if profile is DEFAULT_PROFILE:
        return _default_topology(preset)
    key = (preset, id(profile))
    found = _TOPOLOGIES.get(key)
    if found is None or found[0] is not profile:
        found = _TOPOLOGIES[key] = (profile, build(preset, profile=profile))
    return found[1]


def comm_model(
    topology: Topology, platform: str, profile: HardwareProfile = DEFAULT_PROFILE
) -> CommModel:
    """One CommModel per (topology, platform, profile): its link graph and memoised collectives
    are pure functions of those, so runs over the same platform share them."""
    key = (id(topology), platform, id(profile))
    found = _COMMS.get(key)
    if found is None or found[0] is not topology or found[1] is not profile:
        found = (topology, profile, CommModel(topology, platform, profile))
        _COMMS[key] = found
    return found[2]
