"""The expert-load imbalance of an instance: the busiest die's routed load over the mean, from the
deployment's placement policy (emulator/model/serving/placement.py) over a Zipf-skewed load
histogram (HardwareProfile.serving.expert_load_zipf); `ideal` is a perfectly balanced placement."""

from __future__ import annotations

from functools import cache

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.models import ModelShape
from cmemu.emulator.model.serving.placement import ExpertPlacement, layout, place


def imbalance(
    model: ModelShape, dies: int, policy: str, profile: HardwareProfile = DEFAULT_PROFILE
) -> float:
    if policy == "ideal":
        return 1.0
    return max(1.0, placement(model, dies, policy, profile).imbalance)


def placement(
    model: ModelShape, dies: int, policy: str, profile: HardwareProfile = DEFAULT_PROFILE
) -> ExpertPlacement:
    """The placement `imbalance` is computed from, on dies named d0, d1, ... (what the engine
    remaps when an instance loses dies)."""
    s = profile.serving
    return _placement(
        model,
        dies,
        policy,
        zipf=s.expert_load_zipf,
        shared=s.shared_slot_fraction,
        redundant=s.redundant_slot_fraction,
    )


@cache
def _placement(
    model: ModelShape, dies: int, policy: str, *, zipf: float, shared: float, redundant: float
) -> ExpertPlacement:
    shape = layout(
        dies=dies,
        routed_experts=model.routed_experts,
        shared_fraction=shared,
        redundant_fraction=redundant,
    )
    # experts in a stable shuffled order, so the hottest are not neighbours by index
    order = sorted(range(model.routed_experts), key=lambda e: (e * 97) % model.routed_experts)
    histogram = [0.0] * model.routed_experts
    for rank, e in enumerate(order):
        histogram[e] = 1.0 / (rank + 1) ** zipf
    return place(shape, [f"d{i}" for i in range(dies)], policy=policy, histogram=histogram)
