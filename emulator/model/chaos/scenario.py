"""The chaos scenario document, version 1, and its one parser.

A scenario is data (as KWOK's stages are): the workloads it needs, fault steps at emulated times,
and the expectations its verdict judges. The runner starts the workloads through the public APIs
before the first fault, so `cmemu up -d` then `cmemu chaos run FILE` is all a user types.

    version: 1
    name: npu-crash-decode
    seed: 7
    workloads:
      serving: [{name: decode, deployment: ../examples/deployments/small.yaml, load: {}}]
      training: [{name: pretrain, npus: 4, steps: 100000, checkpoint_every: 20}]
      ems: {objects: 32, size: 1MiB}
    steps:
      - {id: crash, at: 30s, fault: crash, target: {npu: random in deployment decode}}
      - {after: crash, delay: 2m, fault: link-flap, target: {link: random}, params: {period_s: 2},
         duration: 1m, repeat: {count: 3, every: 30s}, jitter: 5s}
    expect: {recovered_within: 10m, lost_objects: 0, failed_requests: 0, slo: {tpot_ms: 50}}

Every error names the YAML path of the bad value (`steps[1].repeat.every`). Fault parameters
are checked by the kind's own `params_from` (emulator/client/faults.py), handed in by the loader
so that this module stays pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.chaos.abort import Abort
from cmemu.emulator.model.chaos.fields import (
    integer,
    label,
    listed,
    mapping,
    number,
    only,
    required,
    string,
)
from cmemu.emulator.model.chaos.selectors import Selector, parse_selector
from cmemu.emulator.model.chaos.units import bad, count_or_rate, duration_s, format_s
from cmemu.emulator.model.chaos.workloads import (
    Workloads,
    parse_workloads,
)
from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError, quote
from cmemu.emulator.model.faults.params import unknown_kind

VERSION = 1
_STEP_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ParamsCheck = Callable[[Mapping[str, Any]], object]


@dataclass(frozen=True, kw_only=True)
class Repeat:
    count: int  # occurrences in all, the first included
    every_s: float


@dataclass(frozen=True, kw_only=True)
class Step:
    id: str
    fault: str
    target: Selector
    params: Mapping[str, Any] = field(default_factory=dict)
    typed_params: object = None  # what the kind's params_from made of `params`, when checked
    at_s: float | None = None  # emulated seconds after the workloads are up ...
    after: str | None = None  # ... or after this step's (first) injection,
    delay_s: float = 0.0  # ... plus this
    duration_s: float | None = None  # cleared after this long; None: at the scenario's end
    repeat: Repeat | None = None
    jitter_s: float = 0.0  # each occurrence starts up to this much later (seeded)
    tolerated: bool = False  # no recovery asked: the workload meets its SLO throughout instead
    path: str = ""  # steps[i], for messages


@dataclass(frozen=True, kw_only=True)
class Slo:
    tpot_ms: float | None = None
    ttft_ms: float | None = None


@dataclass(frozen=True, kw_only=True)
class TrainingProgress:
    min_goodput: float | None = None  # the job's goodput at the end
    max_steps_lost: int | None = None
    max_restarts: int | None = None
    progressing: bool = True  # steps done after the last fault's restore


@dataclass(frozen=True, kw_only=True)
class SteadyState:
    """The hypothesis held before the first fault (else nothing is injected and the run fails)
    and after the last: at most this many failed requests in each window, at most this many
    incidents open at its end."""

    failed_requests: int | None = None
    open_incidents: int | None = None


BLAST_RADII = ("targeted",)  # targeted: no incident on a device no step targeted


@dataclass(frozen=True, kw_only=True)
class Expectations:
    recovered_within_s: float | None = None
    # every fault a detector is for (not tolerated, not the control plane's) detected this soon:
    # a fault nothing detected but the scenario cleared passes recovered_within, not this
    detected_within_s: float | None = None
    lost_objects: int | None = None
    failed_requests: int | None = None
    failed_rate: float | None = None
    dropped_requests: int | None = None
    slo: Slo | None = None
    training_progress: TrainingProgress | None = None
    unrecoverable: int | None = None  # incidents the manager gave up on
    blast_radius: str | None = None  # one of BLAST_RADII
    steady_state: SteadyState | None = None


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    description: str = ""
    preset: str | None = None  # what it was written for (informational)
    seed: int = 0
    duration_s: float | None = None  # observe at most this long after the workloads are up
    # the pace of the steps and traffic (emulated s per wall s, at most the emulator's own); the
    # set-up (deploys, weights loading) runs at the emulator's: None, the emulator's throughout
    time_scale: float | None = None
    abort: Abort | None = None  # bounds that halt the run when crossed
    workloads: Workloads = field(default_factory=Workloads)
    steps: tuple[Step, ...] = ()
    expect: Expectations = field(default_factory=Expectations)

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise UnknownNameError("step", step_id, [s.id for s in self.steps])


# --- helpers -----------------------------------------------------------------------------------


def _scale(raw: object) -> float:
    scale = number(raw, "time_scale")
    if scale <= 0 or scale == float("inf"):
        raise bad("time_scale", f"expected a number > 0, got {raw!r}")
    return scale


def _abort(raw: object) -> Abort:
    body = mapping(raw, "abort")
    only(body, ("failed_requests", "open_incidents"), "abort")
    if not body:
        raise bad("abort", "name failed_requests or open_incidents (or both)")
    return Abort(**{k: integer(v, f"abort.{k}") for k, v in body.items()})


# --- sections ----------------------------------------------------------------------------------


STEP_FIELDS = ("id", "at", "after", "delay", "fault", "target", "params", "duration", "repeat",
               "jitter", "tolerated")  # fmt: skip


def _step(raw: object, index: int, kinds: Mapping[str, ParamsCheck] | None) -> Step:
    path = f"steps[{index}]"
    body = mapping(raw, path)
    only(body, STEP_FIELDS, path)
    step_id = string(body.get("id", f"step-{index + 1}"), f"{path}.id")
    if not _STEP_ID.match(step_id):
        raise bad(
            f"{path}.id", f"a step id is letters, digits, '.', '_', '-', got {quote(step_id)}"
        )
    fault = string(required(body, "fault", path), f"{path}.fault")
    params = mapping(body.get("params", {}), f"{path}.params")
    typed: object = None
    if kinds is not None:
        if fault not in kinds:
            raise bad(f"{path}.fault", str(unknown_kind(fault, sorted(kinds))))
        try:
            typed = kinds[fault](params)
        except InvalidArgumentError as exc:
            raise bad(f"{path}.params" + (f".{exc.field}" if exc.field else ""), str(exc)) from exc
    if ("at" in body) == ("after" in body):
        raise bad(
            path,
            "a step starts either at an emulated time (at: 30s) or after another "
            "step (after: STEP-ID), exactly one",
        )
    if "delay" in body and "after" not in body:
        raise bad(f"{path}.delay", "delay goes with after: (at: already is a time)")
    repeat = None
    if "repeat" in body:
        rbody = mapping(body["repeat"], f"{path}.repeat")
        only(rbody, ("count", "every"), f"{path}.repeat")
        repeat = Repeat(
            count=integer(required(rbody, "count", f"{path}.repeat"), f"{path}.repeat.count",
                       minimum=1),
            every_s=duration_s(required(rbody, "every", f"{path}.repeat"),
                               f"{path}.repeat.every", allow_zero=False),
        )  # fmt: skip
    tolerated = body.get("tolerated", False)
    if not isinstance(tolerated, bool):
        raise bad(f"{path}.tolerated", f"expected true or false, got {quote(tolerated)}")
    return Step(
        id=step_id,
        fault=fault,
        target=parse_selector(required(body, "target", path), f"{path}.target"),
        params=params,
        typed_params=typed,
        at_s=duration_s(body["at"], f"{path}.at") if "at" in body else None,
        after=string(body["after"], f"{path}.after") if "after" in body else None,
        delay_s=duration_s(body.get("delay", 0), f"{path}.delay"),
        duration_s=(duration_s(body["duration"], f"{path}.duration", allow_zero=False)
                    if "duration" in body else None),
        repeat=repeat,
        jitter_s=duration_s(body.get("jitter", 0), f"{path}.jitter"),
        tolerated=tolerated,
        path=path,
    )  # fmt: skip


def _check_order(steps: Sequence[Step]) -> None:
    """Every `after` names an existing step, and no chain of them loops."""
    ids = [s.id for s in steps]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise bad("steps", f"two steps have the id {quote(dup)}")
    by_id = {s.id: s for s in steps}
    for s in steps:
        if s.after is not None and s.after not in by_id:
            raise bad(f"{s.path}.after", f"no step {quote(s.after)}; steps: {', '.join(ids)}")
        seen = {s.id}
        cur = s
        while cur.after is not None:
            cur = by_id[cur.after]
            if cur.id in seen:
                raise bad(
                    f"{s.path}.after",
                    f"steps wait for each other in a loop through {quote(cur.id)}",
                )
            seen.add(cur.id)


def _expect(raw: object) -> Expectations:
    path = "expect"
    body = mapping(raw, path)
    known = ("recovered_within", "detected_within", "lost_objects", "failed_requests",
             "dropped_requests", "slo", "training_progress", "unrecoverable", "blast_radius",
             "steady_state")  # fmt: skip
    only(body, known, path)
    failed: tuple[int | None, float | None] = (None, None)
    if "failed_requests" in body:
        failed = count_or_rate(body["failed_requests"], f"{path}.failed_requests")
    slo = None
    if "slo" in body:
        sbody = mapping(body["slo"], f"{path}.slo")
        only(sbody, ("tpot_ms", "ttft_ms"), f"{path}.slo")
        if not sbody:
            raise bad(f"{path}.slo", "name tpot_ms or ttft_ms (or both)")
        slo = Slo(**{k: number(v, f"{path}.slo.{k}", minimum=1e-9) for k, v in sbody.items()})
    progress = None
    if "training_progress" in body:
        tp = f"{path}.training_progress"
        tbody = mapping(body["training_progress"], tp)
        only(tbody, ("min_goodput", "max_steps_lost", "max_restarts", "progressing"), tp)
        progressing = tbody.get("progressing", True)
        if not isinstance(progressing, bool):
            raise bad(f"{tp}.progressing", f"expected true or false, got {quote(progressing)}")
        progress = TrainingProgress(
            min_goodput=(number(tbody["min_goodput"], f"{tp}.min_goodput", maximum=1.0)
                         if "min_goodput" in tbody else None),
            max_steps_lost=(integer(tbody["max_steps_lost"], f"{tp}.max_steps_lost")
                            if "max_steps_lost" in tbody else None),
            max_restarts=(integer(tbody["max_restarts"], f"{tp}.max_restarts")
                          if "max_restarts" in tbody else None),
            progressing=progressing,
        )  # fmt: skip

    def count(key: str) -> int | None:
        return integer(body[key], f"{path}.{key}") if key in body else None

    radius = None
    if "blast_radius" in body:
        radius = string(body["blast_radius"], f"{path}.blast_radius")
        if radius not in BLAST_RADII:
            raise bad(
                f"{path}.blast_radius",
                f"expected one of {', '.join(BLAST_RADII)}, got {quote(radius)}",
            )
    steady = None
    if "steady_state" in body:
        sp = f"{path}.steady_state"
        sbody = mapping(body["steady_state"], sp)
        only(sbody, ("failed_requests", "open_incidents"), sp)
        if not sbody:
            raise bad(sp, "name failed_requests or open_incidents (or both)")
        steady = SteadyState(**{k: integer(v, f"{sp}.{k}") for k, v in sbody.items()})

    return Expectations(
        recovered_within_s=(duration_s(body["recovered_within"], f"{path}.recovered_within",
                                       allow_zero=False)
                            if "recovered_within" in body else None),
        detected_within_s=(duration_s(body["detected_within"], f"{path}.detected_within",
                                      allow_zero=False)
                           if "detected_within" in body else None),
        lost_objects=count("lost_objects"),
        failed_requests=failed[0],
        failed_rate=failed[1],
        dropped_requests=count("dropped_requests"),
        slo=slo,
        training_progress=progress,
        unrecoverable=count("unrecoverable"),
        blast_radius=radius,
        steady_state=steady,
    )  # fmt: skip


TOP_FIELDS = ("version", "name", "description", "preset", "seed", "duration", "time_scale",
              "abort", "workloads", "steps", "expect")  # fmt: skip


def parse_scenario(
    raw: object,
    *,
    kinds: Mapping[str, ParamsCheck] | None = None,
    documents: Mapping[str, Mapping[str, Any]] | None = None,
) -> Scenario:
    """A Scenario from its YAML document. `kinds` maps each fault kind to its params_from (None:
    the kinds and their parameters are not checked here); `documents` holds the deployment files
    the document names, already read (`deployment_refs` lists them)."""
    body = mapping(raw, "(top)")
    only(body, TOP_FIELDS, "")
    version = required(body, "version", "")
    if version != VERSION:
        raise bad("version", f"scenario version {version!r} unsupported; expected {VERSION}")
    workloads = parse_workloads(body.get("workloads", {}), documents or {})
    steps = tuple(
        _step(item, i, kinds) for i, item in enumerate(listed(body.get("steps", []), "steps"))
    )
    _check_order(steps)
    expect = _expect(body.get("expect", {}))
    _check_references(workloads, steps, expect)
    limit = (duration_s(body["duration"], "duration", allow_zero=False)
             if "duration" in body else None)  # fmt: skip
    if limit is not None:
        _check_within(steps, limit)
    return Scenario(
        name=label(required(body, "name", ""), "name"),
        description=string(body.get("description", ""), "description"),
        preset=string(body["preset"], "preset") if "preset" in body else None,
        seed=integer(body.get("seed", 0), "seed"),
        duration_s=limit,
        time_scale=_scale(body["time_scale"]) if "time_scale" in body else None,
        abort=_abort(body["abort"]) if "abort" in body else None,
        workloads=workloads,
        steps=steps,
        expect=expect,
    )  # fmt: skip


def latest_end_s(steps: Sequence[Step]) -> dict[str, float]:
    """Each step's latest possible end (emulated seconds after the workloads are up): its last
    occurrence's start with every jitter at its bound, plus its duration."""
    by_id = {s.id: s for s in steps}
    first: dict[str, float] = {}

    def start(step: Step) -> float:
        if step.id not in first:
            base = start(by_id[step.after]) + step.delay_s if step.after else (step.at_s or 0.0)
            first[step.id] = base + step.jitter_s
        return first[step.id]

    out = {}
    for s in steps:
        last = start(s)
        if s.repeat is not None:
            last += (s.repeat.count - 1) * (s.repeat.every_s + s.jitter_s)
        out[s.id] = last + (s.duration_s or 0.0)
    return out


def _check_within(steps: Sequence[Step], limit_s: float) -> None:
    """The scenario's `duration` is a hard limit: no step may start or last beyond it (the run
    would otherwise go on past it, or leave the fault in for less than it says)."""
    ends = latest_end_s(steps)
    for s in steps:
        if ends[s.id] > limit_s:
            what = "ends" if s.duration_s is not None else "starts"
            raise bad(
                s.path,
                f"step {quote(s.id)} {what} as late as {format_s(ends[s.id])} (at, repeats, "
                f"jitter and duration), past the scenario's duration {format_s(limit_s)}: "
                "the duration is a hard limit",
            )


def _check_references(workloads: Workloads, steps: Sequence[Step], expect: Expectations) -> None:
    """Selectors name workloads the scenario declares; expectations have something to judge."""
    deployments = {w.name for w in workloads.serving}
    jobs = {w.name for w in workloads.training}
    for s in steps:
        t = s.target
        if t.group == "deployment" and t.name not in deployments:
            raise bad(
                f"{s.path}.target.{t.what}",
                f"no serving workload {quote(t.name)}; declared: {sorted(deployments)}",
            )
        if t.group == "job" and t.name not in jobs:
            raise bad(
                f"{s.path}.target.{t.what}",
                f"no training workload {quote(t.name)}; declared: {sorted(jobs)}",
            )
    loaded = any(w.load is not None for w in workloads.serving)
    for s in steps:
        if s.tolerated and not loaded and not jobs:
            raise bad(
                f"{s.path}.tolerated",
                "a tolerated fault is judged on the workload throughout it: give a serving "
                "workload a load, or run a training job",
            )
    if expect.lost_objects is not None and workloads.ems is None:
        raise bad("expect.lost_objects", "needs objects to lose: declare workloads.ems")
    if expect.training_progress is not None and not jobs:
        raise bad("expect.training_progress", "needs a training workload")
    if expect.slo is not None and not loaded:
        raise bad("expect.slo", "needs requests to measure: give a serving workload a load")
    steady = expect.steady_state
    if steady is not None and steady.failed_requests is not None and not loaded:
        raise bad(
            "expect.steady_state.failed_requests",
            "needs requests to count: give a serving workload a load",
        )
    if (expect.failed_requests is not None or expect.failed_rate is not None) and not deployments:
        raise bad("expect.failed_requests", "needs a serving workload")


def deployment_refs(raw: object) -> list[str]:
    """The deployment files a scenario document names (workloads.serving[].deployment), for the
    loader to read before parsing; nothing is validated here."""
    if not isinstance(raw, Mapping):
        return []
    workloads = raw.get("workloads")
    serving = workloads.get("serving") if isinstance(workloads, Mapping) else None
    if not isinstance(serving, list):
        return []
    return [
        w["deployment"]
        for w in serving
        if isinstance(w, Mapping) and isinstance(w.get("deployment"), str)
    ]
