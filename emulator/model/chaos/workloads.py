"""A chaos scenario's workloads: what the runner starts through the public APIs before the
first fault (serving deployments with background load, training jobs, EMS objects) and judges
at the end, and their parsing from the scenario document's `workloads` section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
from cmemu.emulator.model.chaos.units import bad, size_bytes
from cmemu.emulator.model.errors import quote
from cmemu.emulator.model.training.spec import TrainingSpec


@dataclass(frozen=True, kw_only=True)
class ServingLoad:
    """Background requests to a deployment's OpenAI endpoint while the scenario runs: failures
    and SLOs are judged on them."""

    rate_per_s: float = 1.0  # emulated seconds
    input_tokens: int = 512
    output_tokens: int = 16


@dataclass(frozen=True, kw_only=True)
class ServingWorkload:
    name: str
    spec: Mapping[str, Any]  # the deployment document (examples/deployments/*.yaml)
    load: ServingLoad | None = None


@dataclass(frozen=True, kw_only=True)
class EmsWorkload:
    """Objects put into EMS before the first fault and read back at the end: `lost_objects`."""

    objects: int
    size: int
    kind: str = "kv"
    prefix: str = "chaos/"


@dataclass(frozen=True, kw_only=True)
class Workloads:
    serving: tuple[ServingWorkload, ...] = ()
    training: tuple[TrainingSpec, ...] = ()
    ems: EmsWorkload | None = None


def _load(raw: object, path: str) -> ServingLoad:
    body = mapping(raw, path)
    only(body, ("rate_per_s", "input_tokens", "output_tokens"), path)
    d = ServingLoad()
    return ServingLoad(
        rate_per_s=number(body.get("rate_per_s", d.rate_per_s), f"{path}.rate_per_s",
                           minimum=1e-6),
        input_tokens=integer(body.get("input_tokens", d.input_tokens), f"{path}.input_tokens",
                          minimum=1),
        output_tokens=integer(body.get("output_tokens", d.output_tokens), f"{path}.output_tokens",
                           minimum=2),
    )  # fmt: skip


def _serving(raw: object, path: str, documents: Mapping[str, Mapping[str, Any]]) -> ServingWorkload:
    body = mapping(raw, path)
    only(body, ("name", "deployment", "spec", "load"), path)
    name = label(required(body, "name", path), f"{path}.name")
    if ("deployment" in body) == ("spec" in body):
        raise bad(
            path,
            "give the deployment as a file (deployment: PATH) or inline (spec: {...}), exactly one",
        )
    if "spec" in body:
        spec = mapping(body["spec"], f"{path}.spec")
    else:
        ref = string(body["deployment"], f"{path}.deployment")
        if ref not in documents:
            raise bad(f"{path}.deployment", f"deployment file {quote(ref)} was not loaded")
        spec = dict(documents[ref])
    load = _load(body["load"], f"{path}.load") if "load" in body else None
    return ServingWorkload(name=name, spec=spec, load=load)


def _training(raw: object, path: str) -> TrainingSpec:
    body = mapping(raw, path)
    only(body, tuple(TrainingSpec.__dataclass_fields__), path)
    name = label(required(body, "name", path), f"{path}.name")
    # a scenario's training workload runs long and checkpoints often unless it says otherwise
    d = TrainingSpec(name=name, npus=1, model="deepseek-r1", steps=1_000_000, checkpoint_every=100)
    ints = {
        k: integer(
            body.get(k, getattr(d, k)),
            f"{path}.{k}",
            minimum=1 if k in ("steps", "checkpoint_every") else 0,
        )
        for k in ("steps", "checkpoint_every", "data_parallel", "expert_parallel", "micro_batches")
    }
    return TrainingSpec(
        name=name,
        npus=integer(required(body, "npus", path), f"{path}.npus", minimum=1),
        model=string(body.get("model", d.model), f"{path}.model"),
        **ints,
    )


def _ems(raw: object, path: str) -> EmsWorkload:
    body = mapping(raw, path)
    only(body, ("objects", "size", "kind", "prefix"), path)
    kind = string(body.get("kind", "kv"), f"{path}.kind")
    if kind not in ("kv", "weights", "checkpoint"):
        raise bad(f"{path}.kind", f"expected kv, weights or checkpoint, got {quote(kind)}")
    return EmsWorkload(
        objects=integer(required(body, "objects", path), f"{path}.objects", minimum=1),
        size=size_bytes(required(body, "size", path), f"{path}.size"),
        kind=kind,
        prefix=string(body.get("prefix", "chaos/"), f"{path}.prefix"),
    )


def parse_workloads(raw: object, documents: Mapping[str, Mapping[str, Any]]) -> Workloads:
    body = mapping(raw, "workloads")
    only(body, ("serving", "training", "ems"), "workloads")
    serving = tuple(
        _serving(item, f"workloads.serving[{i}]", documents)
        for i, item in enumerate(listed(body.get("serving", []), "workloads.serving"))
    )
    training = tuple(
        _training(item, f"workloads.training[{i}]")
        for i, item in enumerate(listed(body.get("training", []), "workloads.training"))
    )
    names = [w.name for w in serving] + [w.name for w in training]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise bad("workloads", f"two workloads are named {quote(dup)}")
    ems = _ems(body["ems"], "workloads.ems") if "ems" in body else None
    return Workloads(serving=serving, training=training, ems=ems)
