"""Model-mode timing of a training step: the collectives on the topology's link graph
(run_collective, the algorithm the live fabric runs), memoised by their ranks and sizes."""

from __future__ import annotations

from functools import cached_property

from cmemu.emulator.model.collectives import run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.topology import DeviceKind, Topology
from cmemu.emulator.model.training.spec import TrainingShape
from cmemu.emulator.model.training.step import (
    TrainingStepTime,
    gradient_buckets,
    groups,
    moe_tokens_per_rank,
    step_time,
)


class ModelTimer:
    def __init__(self, topology: Topology, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.topology = topology
        self.profile = profile
        self._memo: dict[tuple[str, tuple[str, ...], int], float] = {}

    @cached_property
    def graph(self) -> LinkGraph:
        return LinkGraph(self.topology, self.profile)

    def collective_s(self, op: str, ranks: tuple[str, ...], size: int) -> float:
        """One collective's duration; `size` is bytes (all-reduce) or tokens per rank (MoE)."""
        if len(ranks) < 2 or size <= 0:
            return 0.0
        key = (op, ranks, size)
        found = self._memo.get(key)
        if found is None:
            spec = (
                CollectiveSpec(op=op, tokens_per_rank=size)
                if op.startswith("moe-")
                else CollectiveSpec(op=op, bytes=size)
            )
            endpoints = validate_ranks(self.graph, list(ranks))
            found = self._memo[key] = run_collective(self.graph, endpoints, spec).duration_s
        return found

    def step(self, shape: TrainingShape, dies: list[str]) -> TrainingStepTime:
        g = groups(dies, shape)
        tokens = moe_tokens_per_rank(self.profile)
        bucket = gradient_buckets(shape, self.profile)
        return step_time(
            shape,
            dispatch_s=self.collective_s("moe-dispatch", g.expert_parallel, tokens),
            combine_s=self.collective_s("moe-combine", g.expert_parallel, tokens),
            allreduce_bucket_s=self.collective_s("all-reduce", g.data_parallel, bucket.bytes),
            profile=self.profile,
        )


def first_dies(topology: Topology, npus: int, profile: HardwareProfile) -> list[str]:
    """The dies of the topology's first `npus` NPUs, in order: a model-mode job's ranks."""
    found = [d.id for d in topology.devices if d.kind is DeviceKind.NPU][:npus]
    return [die_id(n, k) for n in found for k in range(profile.npu.dies)]
