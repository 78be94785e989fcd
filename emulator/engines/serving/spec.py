"""A deployment asked of the live supernode, parsed: a Deploy request's YAML document or its
fields and options (`DeployAsk`, the request as plain values: services/serving/wire.py reads it
off the wire) into the model's `Deployment` (`parse_deployment`), with what a live deployment
cannot be (model mode's platforms and hardware overrides) refused, and back to its YAML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cmemu.emulator.model.errors import InvalidArgumentError, quote
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology

if TYPE_CHECKING:  # the serving model (30 ms of imports): with the first deployment, not at boot
    from cmemu.emulator.model.serving.deployment import Deployment

NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,46}[a-z0-9])?$")
LIVE_PLATFORM = "cm384"  # the live supernode is UB everywhere; cluster-roce is model mode only


@dataclass(frozen=True, kw_only=True)
class DeployAsk:
    """A Deploy request (cmemu.v1.DeployRequest): either `spec_yaml` or the fields and options;
    `name` defaults to the model's."""

    name: str = ""
    model: str = ""
    decode_npus: int = 0
    prefill_instances: int = 0
    prefill_npus: int = 0
    options: Mapping[str, str] = field(default_factory=dict)
    spec_yaml: str = ""
    wait: bool = False  # return once it serves (or failed)
    warm: bool = False  # take the weights as cached in EMS already


def spec_dict(request: DeployAsk) -> dict[str, Any]:
    """The deployment document a request describes: its YAML, or its fields and options."""
    import yaml  # imported when used: a boot that never parses YAML loads none

    fields_set = bool(
        request.model
        or request.decode_npus
        or request.prefill_instances
        or request.prefill_npus
        or request.options
    )
    if not request.spec_yaml:
        return _fields_doc(request)
    if fields_set:
        raise InvalidArgumentError(
            "give spec_yaml or the fields (model, decode_npus, ...), not both", field="spec_yaml"
        )
    try:
        doc = yaml.safe_load(request.spec_yaml)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"spec_yaml is not YAML: {exc}", field="spec_yaml") from exc
    if not isinstance(doc, dict):
        raise InvalidArgumentError("spec_yaml must be a mapping", field="spec_yaml")
    return {str(k): v for k, v in doc.items()}


def _fields_doc(request: DeployAsk) -> dict[str, Any]:
    """An option `decode.max_batch_per_die=32` is a dotted path; its value a YAML scalar."""
    import yaml  # imported when used: a boot that never parses YAML loads none

    doc: dict[str, Any] = {}
    if request.model:
        doc["model"] = request.model
    if request.decode_npus:
        doc["decode"] = {"npus": request.decode_npus}
    prefill = {
        k: v
        for k, v in (("instances", request.prefill_instances), ("npus", request.prefill_npus))
        if v
    }
    if prefill:
        doc["prefill"] = prefill
    for key, text in request.options.items():
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidArgumentError(f"option {key}: {exc}", field=f"options.{key}") from exc
        *path, leaf = key.split(".")
        node = doc
        for part in path:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InvalidArgumentError(f"option {key}: {part} is not a section", field=key)
            node = child
        node[leaf] = value
    return doc


def parse_ask(
    request: DeployAsk, topology: Topology, profile: HardwareProfile
) -> tuple[str, Deployment]:
    from cmemu.emulator.model.serving.deployment import parse_deployment
    from cmemu.emulator.model.serving.pdpolicy import live_options, unit_rates

    doc = spec_dict(request)
    doc.setdefault("preset", topology.preset)
    if doc["preset"] != topology.preset:
        raise InvalidArgumentError(
            f"the deployment is for preset {doc['preset']!r}; this supernode is "
            f"{topology.preset!r}",
            field="preset",
        )
    deployment = parse_deployment(doc, profile)
    options = live_options(deployment)
    if options is not None:  # its rates come from the cost model: one that cannot fails now
        unit_rates(deployment, profile=profile).decode(profile.serving.block_tokens, 2)
    if deployment.platform != LIVE_PLATFORM:
        raise InvalidArgumentError(
            f"platform {deployment.platform!r} runs in model mode only (cmemu simulate); "
            f"a live deployment is {LIVE_PLATFORM!r}",
            field="platform",
        )
    if deployment.hardware:
        raise InvalidArgumentError(
            "hardware overrides run in model mode only (cmemu simulate serving); a live "
            "supernode has the hardware it was started with",
            field="hardware",
        )
    name = request.name or deployment.model
    if not NAME.match(name):
        raise InvalidArgumentError(
            f"deployment name {quote(name)}: lower-case letters, digits, '.' and '-', at most 48",
            field="name",
        )
    return name, deployment


def spec_text(deployment: Deployment) -> str:
    """The deployment as a YAML document (what `--deployment FILE` takes)."""
    import yaml  # imported when used: a boot that never parses YAML loads none

    from cmemu.emulator.model.serving.deployment import PdSpec

    doc = asdict(deployment)
    if deployment.pd == PdSpec():  # off: the document as it was before live dynamic PD
        del doc["pd"]
    return yaml.safe_dump({"version": 1, **doc}, sort_keys=False)
