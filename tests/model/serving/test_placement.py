"""Expert placement: the published layouts come out of the general rule, every routed expert is
placed, and EPLB balances a skewed load better than the positional placement."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.serving.placement import (
    POLICIES,
    Layout,
    SlotKind,
    layout,
    place,
)

SHARED, REDUNDANT = 0.1, 0.1  # the published split: 32 of 320 slots each


def _dies(n: int) -> list[str]:
    return [f"n{i // 16:02d}-npu{(i // 2) % 8}.d{i % 2}" for i in range(n)]


def _zipf(n: int, s: float = 1.1) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def _shape(dies: int) -> Layout:
    return layout(
        dies=dies, routed_experts=256, shared_fraction=SHARED, redundant_fraction=REDUNDANT
    )


def test_decode_ep320_is_one_expert_per_die() -> None:
    shape = _shape(320)
    assert (shape.slots_per_die, shape.shared_copies, shape.redundant) == (1, 32, 32)
    for policy in POLICIES:
        p = place(shape, _dies(320), policy=policy)
        assert all(len(s) == 1 for s in p.slots)
        assert p.count(SlotKind.SHARED) == 32
        assert p.count(SlotKind.ROUTED) == 256
        assert p.count(SlotKind.REDUNDANT) == 32


def test_prefill_ep32_is_ten_per_die_one_shared_eight_routed_one_redundant() -> None:
    shape = _shape(32)
    assert (shape.slots_per_die, shape.shared_copies, shape.redundant) == (10, 32, 32)
    p = place(shape, _dies(32), policy="static")
    for slots in p.slots:
        kinds = [s.kind for s in slots]
        assert kinds.count(SlotKind.SHARED) == 1
        assert kinds.count(SlotKind.ROUTED) == 8
        assert kinds.count(SlotKind.REDUNDANT) == 1


@pytest.mark.parametrize("dies", [1, 2, 6, 8, 12, 32, 64, 320, 384])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_routed_expert_is_placed_and_every_slot_used(dies: int, policy: str) -> None:
    shape = _shape(dies)
    p = place(shape, _dies(dies), policy=policy, histogram=_zipf(256))
    placed = {s.expert for slots in p.slots for s in slots if s.kind is not SlotKind.SHARED}
    assert placed == set(range(256))
    assert all(len(s) == shape.slots_per_die for s in p.slots)
    assert sum(p.replicas) == 256 + shape.redundant
    assert sum(p.die_loads()) == pytest.approx(1.0)
    assert p.imbalance >= 1.0


def test_eplb_balances_a_skewed_histogram_better_than_static() -> None:
    for dies in (32, 320):
        shape = _shape(dies)
        skew = _zipf(256)
        static = place(shape, _dies(dies), policy="static", histogram=skew)
        eplb = place(shape, _dies(dies), policy="eplb", histogram=skew)
        assert eplb.imbalance < static.imbalance
        # the hottest expert gets the most copies under EPLB
        assert eplb.replicas[0] == max(eplb.replicas)


def test_eplb_spreads_copies_of_one_expert_over_dies() -> None:
    shape = _shape(32)
    p = place(shape, _dies(32), policy="eplb", histogram=_zipf(256, 1.5))
    for slots in p.slots:
        experts = [s.expert for s in slots if s.kind is not SlotKind.SHARED]
        assert len(experts) == len(set(experts))


def test_uniform_load_prefill_is_balanced() -> None:
    p = place(_shape(32), _dies(32), policy="eplb")
    # 288 copies of 256 equal experts on 32 dies of 9 routed slots: within one copy's share
    assert p.imbalance < 1.05


def test_summary_and_lookup() -> None:
    p = place(_shape(8), _dies(8), policy="static")
    summary = p.summary()
    assert summary["dies"] == 8
    assert summary["routed"] == 256
    assert summary["slots_per_die"] == 40
    assert p.experts_on(_dies(8)[3]) == p.slots[3]
    with pytest.raises(UnknownNameError):
        p.experts_on("n09-npu0.d0")


def test_bad_input() -> None:
    with pytest.raises(UnknownNameError, match="eplb"):
        place(_shape(8), _dies(8), policy="nope")
    with pytest.raises(InvalidArgumentError, match="8 dies"):
        place(_shape(8), _dies(4))
    with pytest.raises(InvalidArgumentError, match="twice"):
        place(_shape(2), ["a", "a"])
    with pytest.raises(InvalidArgumentError, match="entries"):
        place(_shape(8), _dies(8), histogram=[1.0] * 3)
    with pytest.raises(InvalidArgumentError, match="all zero"):
        place(_shape(8), _dies(8), histogram=[0.0] * 256)
    with pytest.raises(InvalidArgumentError, match="finite"):
        place(_shape(8), _dies(8), histogram=[float("nan")] * 256)
    with pytest.raises(InvalidArgumentError):
        layout(dies=0, routed_experts=256, shared_fraction=SHARED, redundant_fraction=REDUNDANT)
    with pytest.raises(InvalidArgumentError):
        layout(dies=8, routed_experts=256, shared_fraction=0.6, redundant_fraction=0.5)


def test_ideal_is_eplb_costed_at_the_mean() -> None:
    shape = _shape(32)
    ideal = place(shape, _dies(32), policy="ideal", histogram=_zipf(256))
    eplb = place(shape, _dies(32), policy="eplb", histogram=_zipf(256))
    assert ideal.imbalance == 1.0
    assert ideal.slots == eplb.slots
