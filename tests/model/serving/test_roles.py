"""An instance changing role in the engine (emulator/model/serving/roles.py, live dynamic PD's
seam): a retiring prefill instance takes no new prompt and hands its queue on, finishes its batch,
drains, leaves and joins as a decode instance that then takes requests; a decode instance drains
as its requests end. One instance of each role always stays."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.engine import Engine, FinishEvent, PlanKind, Request, StepResult
from cmemu.emulator.model.serving.pdpolicy import live_options, unit_rates

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SPEC = {
    "model": "deepseek-r1",
    "preset": "cm-mini",
    "decode": {"instances": 1, "npus": 2, "max_batch_per_die": 4},
    "prefill": {"instances": 2, "npus": 2},
    "ems": {"enabled": False},
    "router": "round-robin",
}


class Loop:
    """The engine driven as the live driver drives it, every measurement zero."""

    def __init__(self) -> None:
        self.engine = Engine(parse_deployment(SPEC))
        self.now = 0.0
        self.finished: list[str] = []
        self.ran: dict[str, set[str]] = {}  # plan kind: instances that ran one

    def submit(self, rid: str, prompt: int, output: int) -> None:
        self.engine.submit(Request(id=rid, arrival_s=self.now, input_tokens=prompt,
                                   output_tokens=output), self.now)  # fmt: skip

    def step(self) -> bool:
        """One round; False when nothing is left to do."""
        advance = self.engine.advance(self.now)
        for event in advance.events:
            if isinstance(event, FinishEvent):
                self.finished.append(event.request_id)
        for plan in advance.plans:
            self.ran.setdefault(plan.kind.value, set()).add(plan.instance)
            self.engine.report(plan.id, StepResult())
        due = self.engine.next_due_time()
        if due is None:
            return False
        self.now = max(self.now, due)
        return True

    def until(self, done: object) -> None:
        for _ in range(100_000):
            if callable(done) and done():
                return
            if not self.step():
                return
        raise AssertionError("the engine did not settle")


def test_a_prefill_instance_drains_leaves_and_joins_as_decode() -> None:
    loop = Loop()
    e = loop.engine
    for i in range(4):
        loop.submit(f"r{i}", 4000, 20)
    loop.step()  # batches start on both prefill instances
    (gone,) = e.retire("prefill", 1, loop.now)
    assert e.retiring() == [gone] and e.roles()[gone] == "prefill"
    loop.ran.clear()
    for i in range(4, 8):
        loop.submit(f"r{i}", 4000, 20)
    loop.until(lambda: e.drained(gone))
    assert e.leave(gone) == "prefill" and gone not in e.roles()
    e.join(gone, "decode")
    assert e.roles()[gone] == "decode" and len(e.decode_load()) == 2
    for i in range(8, 16):
        loop.submit(f"r{i}", 100, 50)
    loop.until(None)
    assert sorted(loop.finished) == sorted(f"r{i}" for i in range(16))  # none lost
    # after it retired, no prefill batch ran there; as decode it took requests
    assert gone not in loop.ran[PlanKind.PREFILL.value]
    assert gone in loop.ran[PlanKind.DECODE.value]


def test_a_decode_instance_drains_as_its_requests_end() -> None:
    loop = Loop()
    e = loop.engine
    (prefill, spare) = [n for n, r in e.roles().items() if r == "prefill"]
    (first,) = e.retire("prefill", 1, 0.0)
    loop.until(lambda: e.drained(first))
    e.leave(first)
    e.join(first, "decode")
    loop.submit("long", 100, 200)
    loop.until(lambda: any(held for held, _ in e.decode_load().values()))
    busy = next(n for n, (held, _) in e.decode_load().items() if held)
    (retired,) = e.retire("decode", 1, loop.now)
    assert retired != busy  # the least loaded goes
    assert e.drained(retired)
    with pytest.raises(PreconditionError, match="one must stay"):
        e.retire("decode", 1, loop.now)
    with pytest.raises(PreconditionError, match="one must stay"):
        e.retire("prefill", 1, loop.now)
    assert {prefill, spare} >= {n for n, r in e.roles().items() if r == "prefill"}
    loop.until(None)
    assert loop.finished == ["long"]


def test_the_live_example_is_a_valid_dynamic_pd_deployment() -> None:
    """examples/deployments/pd-live.yaml (README's live dynamic PD example) as the router
    checks it at deploy: its options, and a decode unit the cost model can rate."""
    doc = yaml.safe_load((EXAMPLES / "deployments" / "pd-live.yaml").read_text())
    d = parse_deployment(doc)
    options = live_options(d)
    assert options is not None and options.policy == "dynamic" and options.interval_s == 30
    rates = unit_rates(d)
    assert rates.units == 4 and rates.load_s == DEFAULT_PROFILE.serving.cache_from_ems_s
    share, hold = rates.decode(512, 2048)
    assert 0 < share < 1 and hold > 0
    assert live_options(parse_deployment({**doc, "pd": "fixed"})) is None
