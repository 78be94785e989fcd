"""The engine under faults (issue 11), driven by the simulator's oracle (pure models, no mocks):
a lost die's experts move to redundant slots, its requests are retried and continue where they
stopped, failed steps are retried up to the limit and then fail visibly, and under random storms
of isolations, restores and failed steps every request ends exactly once (none dropped)."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnknownNameError,
)
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import DieLoss, Oracle, simulate
from cmemu.emulator.model.serving.engine import (
    Engine,
    FinishEvent,
    FinishReason,
    PlanKind,
    Request,
    RetryEvent,
    StepPlan,
    TokenEvent,
    rank_dies,
)
from cmemu.emulator.model.serving.experts import placement
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.placement import SlotKind, layout, place, remap
from cmemu.emulator.model.serving.workload import Distribution, Workload, generate
from cmemu.emulator.model.topology import build

SMALL = {
    "preset": "cm-mini",
    "decode": {"instances": 1, "npus": 4, "max_batch_per_die": 2},
    "prefill": {"instances": 2, "npus": 2, "batch_tokens": 4096},
}
MAX_RETRIES = DEFAULT_PROFILE.serving.max_request_retries


def _deployment(**changes: object) -> Deployment:
    return parse_deployment({**SMALL, **changes})


def _requests(n: int, seed: int, rate: float = 20.0) -> list[Request]:
    w = Workload(
        input=Distribution(kind="uniform", low=100, high=3000),
        output=Distribution(kind="uniform", low=2, high=40),
        rate_per_s=rate,
        prefix_reuse=0.5,
        prefix_pool=3,
        requests=n,
        seed=seed,
    )
    return list(generate(w, block_tokens=512))


# --- placement.remap ----------------------------------------------------------------------------


def test_lost_dies_experts_move_to_redundant_slots() -> None:
    p = placement(get_model("deepseek-r1"), 32, "static")  # 10 slots a die: 26 redundant
    lost = ["d3", "d17"]
    r = remap(p, lost)
    after = r.placement
    assert after.dies == tuple(d for d in p.dies if d not in lost)
    assert not r.degraded
    assert all(n >= 1 for n in after.replicas)  # every routed expert still has a copy
    kept = {s.expert for d in after.dies for s in p.experts_on(d) if s.kind is not SlotKind.SHARED}
    orphans = {
        s.expert for d in lost for s in p.experts_on(d) if s.kind is not SlotKind.SHARED
    } - kept
    assert orphans and {e for e, _ in r.moved if e >= 0} == orphans
    # no die grows: redundant slots were taken over in place
    assert all(len(s) == len(p.slots[0]) for s in after.slots)
    assert after.count(SlotKind.REDUNDANT) < p.count(SlotKind.REDUNDANT)
    assert abs(sum(after.die_loads()) - 1.0) < 1e-9  # all the routed tokens still land
    assert after.imbalance >= 1.0


def test_without_redundant_slots_left_the_instance_is_degraded_but_covers_every_expert() -> None:
    shape = layout(dies=8, routed_experts=16, shared_fraction=0.0, redundant_fraction=0.0)
    p = place(shape, [f"d{i}" for i in range(8)])
    assert p.count(SlotKind.REDUNDANT) == 0
    r = remap(p, ["d0", "d1"])
    assert r.degraded and not r.moved
    assert sorted(e for e, _ in r.overflow) == sorted(
        s.expert for d in ("d0", "d1") for s in p.experts_on(d)
    )
    assert all(n == 1 for n in r.placement.replicas)
    assert r.placement.imbalance > 1.0  # the dies that took the extra experts are busier


def test_ideal_stays_ideal_and_bad_remaps_are_refused() -> None:
    ideal = placement(get_model("deepseek-r1"), 16, "ideal")
    assert remap(ideal, ["d0"]).placement.imbalance == 1.0
    p = placement(get_model("deepseek-r1"), 16, "static")
    with pytest.raises(UnknownNameError, match="d99"):
        remap(p, ["d99"])
    with pytest.raises(InvalidArgumentError, match="every die"):
        remap(p, list(p.dies))


# --- the engine -------------------------------------------------------------------------------


class Run:
    """The simulator's loop with faults at chosen instants, keeping every event and plan."""

    def __init__(self, deployment: Deployment) -> None:
        self.engine = Engine(deployment)
        self.oracle = Oracle(deployment, build(deployment.preset))
        self.events: list[TokenEvent | FinishEvent | RetryEvent] = []
        self.plans: list[StepPlan] = []
        self.submitted: dict[str, Request] = {}

    def go(
        self,
        requests: list[Request],
        faults: list[tuple[float, str, tuple[object, ...]]] = (),  # type: ignore[assignment]
        fail_plan: object = None,
    ) -> None:
        """Run to the end; `faults` are (instant, "isolate"|"restore", (instance, dies));
        `fail_plan(plan) -> bool` makes chosen plans fail instead of being answered."""
        pending = sorted(requests, key=lambda r: r.arrival_s)
        changes = sorted(faults, key=lambda f: f[0])
        while True:
            due = self.engine.next_due_time()
            times = [t for t in (due,) if t is not None]
            times += [pending[0].arrival_s] if pending else []
            times += [changes[0][0]] if changes else []
            if not times:
                return
            now = min(times)
            while changes and changes[0][0] <= now:
                _, what, (instance, dies) = changes.pop(0)
                getattr(self.engine, what)(instance, dies, now)
            while pending and pending[0].arrival_s <= now:
                r = pending.pop(0)
                self.submitted[r.id] = r
                self.engine.submit(r, now)
            out = self.engine.advance(now)
            self.events += out.events
            for plan in out.plans:
                self.plans.append(plan)
                if callable(fail_plan) and fail_plan(plan):
                    self.engine.fail(plan.id, now + 0.5, "injected")
                else:
                    self.engine.report(plan.id, self.oracle.answer(plan))

    def check(self) -> dict[str, FinishEvent]:
        """Every request submitted ends exactly once; its tokens are contiguous from 0 and a
        LENGTH finish has all of them; retries never exceed the limit."""
        finishes: dict[str, FinishEvent] = {}
        tokens: dict[str, list[int]] = defaultdict(list)
        retries: dict[str, int] = defaultdict(int)
        for e in self.events:
            if isinstance(e, FinishEvent):
                assert e.request_id not in finishes, e
                finishes[e.request_id] = e
            elif isinstance(e, TokenEvent):
                assert e.request_id not in finishes
                tokens[e.request_id] += range(e.index, e.index + e.count)
            else:
                retries[e.request_id] += 1
        assert set(finishes) == set(self.submitted)  # none dropped
        assert self.engine.in_flight == 0
        for rid, f in finishes.items():
            assert tokens[rid] == list(range(len(tokens[rid]))), rid  # in order, none twice
            assert f.tokens == len(tokens[rid])
            if f.reason is FinishReason.LENGTH:
                assert f.tokens == self.submitted[rid].output_tokens
            if f.reason is FinishReason.ERROR:
                assert f.error
            assert retries[rid] <= MAX_RETRIES
        return finishes


def test_a_lost_decode_die_is_remapped_and_its_requests_continue() -> None:
    d = _deployment()
    run = Run(d)
    before = run.engine.imbalance("decode-0")
    requests = _requests(40, seed=1)
    run.go(
        requests, [(0.8, "isolate", ("decode-0", (0, 1))), (3.0, "restore", ("decode-0", (0, 1)))]
    )
    finishes = run.check()
    assert all(f.reason is FinishReason.LENGTH for f in finishes.values())
    assert run.engine.stats.retries > 0  # requests on the lost dies were prefilled again
    decodes = [p for p in run.plans if p.kind is PlanKind.DECODE and p.moe is not None]
    during = [p for p in decodes if 0.8 <= p.start_s < 3.0]
    after = [p for p in decodes if p.start_s >= 3.0]
    assert during and after
    ep = d.decode_ep()
    assert all(p.moe.ranks == ep - 2 and p.moe.lost == (0, 1) for p in during)  # type: ignore[union-attr]
    assert all(p.moe.ranks == ep and p.moe.lost == () for p in after)  # type: ignore[union-attr]
    dies = [f"x.d{i}" for i in range(ep)]
    assert "x.d0" not in rank_dies(dies, during[0].moe)  # type: ignore[arg-type]
    assert run.engine.imbalance("decode-0") == before  # restored at the deployed placement


def test_the_cost_model_charges_the_remap() -> None:
    engine = Engine(_deployment(decode={"instances": 1, "npus": 4, "max_batch_per_die": 2}))
    before = engine.imbalance("decode-0")
    engine.isolate("decode-0", (0, 1), 0.0)
    remapped = engine.remapped("decode-0")
    assert remapped is not None and len(remapped.placement.dies) == 6
    assert engine.imbalance("decode-0") == max(1.0, remapped.placement.imbalance)
    assert engine.imbalance("decode-0") != before
    assert engine.isolated() == {"decode-0": (0, 1)}
    assert engine.decode_load()["decode-0"][1] == 6 * 2  # the lost dies' slots are gone


def test_failed_steps_are_retried_then_fail_visibly() -> None:
    run = Run(_deployment())
    requests = _requests(12, seed=2)
    # every decode step fails: each request in a batch is retried, then fails with an error
    run.go(requests, fail_plan=lambda p: p.kind is PlanKind.DECODE)
    finishes = run.check()
    assert {f.reason for f in finishes.values()} == {FinishReason.ERROR}
    assert all("decode step" in f.error for f in finishes.values())
    assert run.engine.stats.failed == len(requests)


def test_a_transient_failure_costs_a_retry_not_the_request() -> None:
    run = Run(_deployment())
    failed: set[PlanKind] = set()

    def once_per_kind(plan: StepPlan) -> bool:
        if plan.kind in failed:
            return False
        failed.add(plan.kind)
        return True

    run.go(_requests(20, seed=3), fail_plan=once_per_kind)
    finishes = run.check()
    assert all(f.reason is FinishReason.LENGTH for f in finishes.values())
    assert failed == set(PlanKind)  # a failed lookup is a miss; the others retried
    assert run.engine.stats.failed_steps == 4 and run.engine.stats.retries > 0


def test_a_prefill_instance_that_lost_a_die_hands_its_queue_on() -> None:
    run = Run(_deployment())
    run.go(_requests(30, seed=4), [(0.3, "isolate", ("prefill-0", (1,)))])
    finishes = run.check()
    assert all(f.reason is FinishReason.LENGTH for f in finishes.values())
    prefills = [p for p in run.plans if p.kind is PlanKind.PREFILL and p.start_s > 0.3]
    assert prefills and all(p.instance == "prefill-1" for p in prefills)


def test_with_no_prefill_instance_requests_fail_at_once() -> None:
    engine = Engine(_deployment())
    for inst in ("prefill-0", "prefill-1"):
        engine.isolate(inst, (0,), 0.0)
    assert not engine.accepting()
    engine.submit(Request(id="r", arrival_s=0.0, input_tokens=10, output_tokens=5), 0.0)
    (event,) = engine.advance(0.0).events
    assert isinstance(event, FinishEvent) and event.reason is FinishReason.ERROR
    assert "no prefill instance" in event.error and engine.in_flight == 0
    engine.restore("prefill-0", (0,), 1.0)
    assert engine.accepting()


def test_bad_fault_calls_are_refused() -> None:
    engine = Engine(_deployment())
    with pytest.raises(NotFoundError, match="decode-7"):
        engine.isolate("decode-7", (0,), 0.0)
    with pytest.raises(InvalidArgumentError, match=r"dies 0\.\.7"):
        engine.isolate("decode-0", (8,), 0.0)
    with pytest.raises(NotFoundError):
        engine.fail(99, 1.0, "x")
    engine.submit(Request(id="r", arrival_s=0.0, input_tokens=10, output_tokens=5), 0.0)
    (plan,) = engine.advance(0.0).plans
    engine.fail(plan.id, 1.0, "x")
    with pytest.raises(PreconditionError):
        engine.fail(plan.id, 1.0, "x")
    other = Engine(_deployment())
    other.submit(Request(id="r", arrival_s=0.0, input_tokens=10, output_tokens=5), 0.0)
    (plan,) = other.advance(0.0).plans
    with pytest.raises(InvalidArgumentError, match="finite"):
        other.fail(plan.id, float("nan"), "x")


@pytest.mark.parametrize("seed", range(6))
def test_storms_of_faults_drop_nothing(seed: int) -> None:
    """Random isolations and restores of decode and prefill dies and random failed steps: every
    request still ends exactly once, with its tokens in order."""
    rng = random.Random(seed)
    d = _deployment(decode={"instances": 2, "npus": 2, "max_batch_per_die": 2})
    run = Run(d)
    faults: list[tuple[float, str, tuple[object, ...]]] = []
    for _ in range(6):
        inst = rng.choice(["decode-0", "decode-1", "prefill-0", "prefill-1"])
        dies = (rng.randrange(4),)
        t = rng.uniform(0.0, 2.0)
        faults.append((t, "isolate", (inst, dies)))
        faults.append((t + rng.uniform(0.1, 1.5), "restore", (inst, dies)))
    run.go(_requests(40, seed=seed), faults, fail_plan=lambda p: rng.random() < 0.1)
    finishes = run.check()
    assert len(finishes) == 40


# --- the simulator's failure schedule ---------------------------------------------------------


def test_the_simulator_takes_a_failure_schedule() -> None:
    d = _deployment()
    requests = _requests(30, seed=5)
    clean = simulate(d, requests)
    lost = simulate(
        d,
        requests,
        failures=[
            DieLoss(at_s=1.0, instance="decode-0", npu=0, restored_s=2.5, replacement="n01-npu7")
        ],
    )
    assert lost.recorder.failed == 0 and lost.recorder.retries > 0
    assert sum(t for _, t in lost.recorder.finish.values()) == sum(
        t for _, t in clean.recorder.finish.values()
    )
    assert lost.engine.stats.abandoned_steps >= 1
    with pytest.raises(InvalidArgumentError, match="no NPU 9"):
        simulate(d, requests, failures=[DieLoss(at_s=0.5, instance="decode-0", npu=9)])
    with pytest.raises(InvalidArgumentError, match="restored before"):
        simulate(
            d, requests, failures=[DieLoss(at_s=0.5, instance="decode-0", npu=0, restored_s=0.1)]
        )


def test_with_no_decode_die_left_prefilled_requests_fail_rather_than_wait() -> None:
    run = Run(_deployment())
    run.go(_requests(10, seed=6), [(0.2, "isolate", ("decode-0", tuple(range(8))))])
    finishes = run.check()
    failed = [f for f in finishes.values() if f.reason is FinishReason.ERROR]
    assert failed and all("no decode instance" in f.error for f in failed)
    assert not run.engine.accepting()
