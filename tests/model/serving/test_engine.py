"""The engine's invariants, driven by the simulator's own oracle (pure models, no mocks): every
accepted request finishes or is cancelled, tokens come in order, a decode batch never exceeds its
cap, and every KV slot is freed."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import Oracle
from cmemu.emulator.model.serving.engine import (
    Engine,
    Event,
    FinishEvent,
    FinishReason,
    PlanKind,
    Request,
    StepPlan,
    StepResult,
    TokenEvent,
)
from cmemu.emulator.model.serving.workload import Distribution, Workload, generate
from cmemu.emulator.model.topology import build

SMALL = {
    "preset": "cm-mini",
    "decode": {"instances": 2, "npus": 4, "max_batch_per_die": 2},
    "prefill": {"instances": 2, "npus": 2, "batch_tokens": 4096},
}


def _deployment(**changes: object) -> Deployment:
    return parse_deployment({**SMALL, **changes})


def _requests(n: int, seed: int) -> list[Request]:
    w = Workload(
        input=Distribution(kind="uniform", low=100, high=3000),
        output=Distribution(kind="uniform", low=1, high=40),
        rate_per_s=20.0,
        prefix_reuse=0.5,
        prefix_pool=3,
        requests=n,
        seed=seed,
    )
    return list(generate(w, block_tokens=512))


class Driver:
    """The simulator's loop, keeping every event and plan for the checks."""

    def __init__(self, deployment: Deployment, *, stream: bool = True) -> None:
        self.deployment = deployment
        self.engine = Engine(deployment, stream_tokens=stream)
        self.oracle = Oracle(deployment, build(deployment.preset))
        self.events: list[Event] = []
        self.plans: list[StepPlan] = []
        self.now = 0.0

    def step(self, now: float) -> None:
        self.now = now
        out = self.engine.advance(now)
        self.events += out.events
        for plan in out.plans:
            self.plans.append(plan)
            self.engine.report(plan.id, self.oracle.answer(plan))

    def run(self, requests: list[Request], cancel: dict[str, float] | None = None) -> None:
        pending = sorted(requests, key=lambda r: r.arrival_s)
        cancels = sorted((t, rid) for rid, t in (cancel or {}).items())
        while True:
            due = self.engine.next_due_time()
            times = [due] if due is not None else []
            if pending:
                times.append(pending[0].arrival_s)
            if cancels:
                times.append(cancels[0][0])
            if not times:
                return
            now = min(times)
            while pending and pending[0].arrival_s <= now:
                self.engine.submit(pending.pop(0), now)
            while cancels and cancels[0][0] <= now:
                self.engine.cancel(cancels.pop(0)[1], now)
            self.step(now)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_request_finishes_with_its_tokens_in_order(seed: int) -> None:
    requests = _requests(60, seed)
    d = Driver(_deployment())
    d.run(requests)
    tokens: dict[str, list[tuple[int, int]]] = defaultdict(list)
    finished: dict[str, FinishEvent] = {}
    last = 0.0
    for e in d.events:
        assert e.time_s >= last - 1e-12  # events come in time order across calls
        last = e.time_s
        if isinstance(e, TokenEvent):
            assert e.request_id not in finished
            tokens[e.request_id].append((e.index, e.count))
        elif isinstance(e, FinishEvent):
            assert e.request_id not in finished
            finished[e.request_id] = e
    assert set(finished) == {r.id for r in requests}
    for r in requests:
        got = tokens[r.id]
        expected_index = 0
        for index, count in got:
            assert index == expected_index and count >= 1
            expected_index += count
        assert expected_index == r.output_tokens == finished[r.id].tokens
        assert finished[r.id].reason is FinishReason.LENGTH
    assert d.engine.in_flight == 0
    assert all(held == 0 for held, _ in d.engine.decode_load().values())
    assert d.engine.next_due_time() is None


def test_a_decode_batch_never_exceeds_the_cap_per_die() -> None:
    deployment = _deployment()
    d = Driver(deployment)
    d.run(_requests(80, 5))
    decodes = [p for p in d.plans if p.kind is PlanKind.DECODE]
    assert decodes
    cap = deployment.decode.max_batch_per_die
    assert max(p.batch_per_die for p in decodes) == cap  # the load reaches it
    assert all(1 <= p.batch_per_die <= cap for p in decodes)
    for p in decodes:
        assert len(p.requests) <= cap * deployment.decode_dies()
    assert d.engine.stats.batch_per_die_max == cap


def test_prefill_batches_keep_to_their_token_budget() -> None:
    deployment = _deployment()
    d = Driver(deployment)
    requests = {r.id: r for r in _requests(40, 9)}
    d.run(list(requests.values()))
    for p in (p for p in d.plans if p.kind is PlanKind.PREFILL):
        assert p.moe is not None and p.moe.ranks == deployment.prefill_ep()
        if len(p.requests) > 1:
            assert sum(requests[r].input_tokens for r in p.requests) <= 4096 + 512 * 8


def test_cancel_in_every_stage_frees_the_request_and_its_slot() -> None:
    requests = _requests(30, 4)
    # cancel at many moments: some queued, some prefilling, some decoding
    cancel = {r.id: r.arrival_s + 0.05 * i for i, r in enumerate(requests) if i % 2 == 0}
    d = Driver(_deployment())
    d.run(requests, cancel)
    ends = {e.request_id: e for e in d.events if isinstance(e, FinishEvent)}
    assert set(ends) == {r.id for r in requests}
    cancelled = [e for e in ends.values() if e.reason is FinishReason.CANCELLED]
    assert cancelled and all(e.request_id in cancel for e in cancelled)
    for e in cancelled:  # nothing after the cancel
        later = [
            t
            for t in d.events
            if isinstance(t, TokenEvent) and t.request_id == e.request_id and t.time_s > e.time_s
        ]
        assert not later
    assert d.engine.in_flight == 0
    assert all(held == 0 for held, _ in d.engine.decode_load().values())
    assert d.engine.stats.cancelled == len(cancelled)
    assert not d.engine.cancel(cancelled[0].request_id, d.now)  # already gone
    assert not d.engine.cancel("nobody", d.now)


def test_without_streaming_only_first_tokens_and_finishes_are_emitted() -> None:
    requests = _requests(20, 6)
    d = Driver(_deployment(), stream=False)
    d.run(requests)
    firsts = [e for e in d.events if isinstance(e, TokenEvent)]
    assert sorted(e.request_id for e in firsts) == sorted(r.id for r in requests)
    assert all(e.index == 0 and e.count == 1 for e in firsts)
    out = sum(r.output_tokens for r in requests)
    assert d.engine.stats.decode_tokens + len(firsts) == out


def test_lookups_only_with_ems_and_block_keys() -> None:
    on, off = Driver(_deployment()), Driver(_deployment(ems={"enabled": False}))
    requests = _requests(20, 8)
    on.run(requests)
    off.run(requests)
    assert any(p.kind is PlanKind.LOOKUP for p in on.plans)
    assert not any(p.kind is PlanKind.LOOKUP for p in off.plans)
    assert on.engine.stats.matched_blocks > 0 == off.engine.stats.matched_blocks
    assert on.engine.stats.prefill_tokens < off.engine.stats.prefill_tokens


def test_mtp_makes_1_7_tokens_per_step_on_average() -> None:
    engine = Engine(_deployment(decode={"instances": 1, "npus": 1, "max_batch_per_die": 1}))
    engine.submit(Request(id="a", arrival_s=0, input_tokens=10, output_tokens=1001), 0.0)
    oracle = Oracle(engine.deployment, build("cm-mini"))
    now, steps, tokens = 0.0, 0, 0
    while (due := engine.next_due_time()) is not None or now == 0.0:
        now = due if due is not None else now
        out = engine.advance(now)
        tokens += sum(e.count for e in out.events if isinstance(e, TokenEvent))
        for plan in out.plans:
            steps += plan.kind is PlanKind.DECODE
            engine.report(plan.id, oracle.answer(plan))
        if due is None and not out.plans:
            break
    assert tokens == 1001
    assert 1000 / steps == pytest.approx(1.7, abs=0.01)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (Request(id="", arrival_s=0, input_tokens=10, output_tokens=1), "id"),
        (Request(id="x", arrival_s=0, input_tokens=0, output_tokens=1), "input_tokens"),
        (Request(id="x", arrival_s=0, input_tokens=10, output_tokens=0), "input_tokens"),
        (
            Request(id="x", arrival_s=0, input_tokens=600, output_tokens=1, block_keys=("a", "b")),
            "block_keys",
        ),
    ],
)
def test_bad_requests_are_refused(bad: Request, field: str) -> None:
    engine = Engine(_deployment())
    with pytest.raises(InvalidArgumentError) as info:
        engine.submit(bad, 0.0)
    assert info.value.field == field
    assert engine.in_flight == 0


def test_a_repeated_id_and_bad_reports_are_refused() -> None:
    engine = Engine(_deployment())
    r = Request(id="x", arrival_s=0, input_tokens=100, output_tokens=3)
    engine.submit(r, 0.0)
    with pytest.raises(InvalidArgumentError):
        engine.submit(r, 0.0)
    (plan,) = engine.advance(0.0).plans
    assert plan.kind is PlanKind.PREFILL
    with pytest.raises(InvalidArgumentError):
        engine.report(plan.id, StepResult(dispatch_s=-1.0))
    with pytest.raises(InvalidArgumentError):
        engine.report(plan.id, StepResult(combine_s=float("nan")))
    with pytest.raises(NotFoundError):
        engine.report(plan.id + 100, StepResult())
    engine.report(plan.id, StepResult(dispatch_s=1e-4, combine_s=1e-4))
    with pytest.raises(PreconditionError):
        engine.report(plan.id, StepResult())
    due = engine.next_due_time()
    assert due is not None and due > plan.start_s


def test_a_one_token_request_finishes_at_prefill() -> None:
    d = Driver(_deployment())
    d.run([Request(id="one", arrival_s=0.0, input_tokens=700, output_tokens=1)])
    kinds = {p.kind for p in d.plans}
    assert PlanKind.DECODE not in kinds and PlanKind.TRANSFER not in kinds
    first, end = d.events
    assert isinstance(first, TokenEvent) and isinstance(end, FinishEvent)
    assert first.time_s == end.time_s and end.tokens == 1


def test_routers_spread_requests_over_instances() -> None:
    for router in ("kv-aware", "prefix-aware", "round-robin"):
        d = Driver(_deployment(router=router))
        d.run(_requests(30, 11))
        assert {p.instance for p in d.plans if p.kind is PlanKind.PREFILL} == {
            "prefill-0",
            "prefill-1",
        }, router
        assert {p.instance for p in d.plans if p.kind is PlanKind.DECODE} == {
            "decode-0",
            "decode-1",
        }, router


def test_random_cancels_never_leak(seed: int = 12) -> None:
    rng = random.Random(seed)
    requests = _requests(50, seed)
    cancel = {r.id: r.arrival_s + rng.uniform(0, 2) for r in requests if rng.random() < 0.4}
    d = Driver(_deployment())
    d.run(requests, cancel)
    assert d.engine.in_flight == 0
    assert all(held == 0 for held, _ in d.engine.decode_load().values())
    s = d.engine.stats
    assert s.finished + s.cancelled == len(requests)
