"""A serving deployment as data: which model, on which platform, how many decode and prefill
instances of what size, the router policy, the EMS prefix cache. Parsed from a plain dict (the
CLI reads YAML into one); every bad field is an InvalidArgumentError naming it.

Instances are laid on the platform's NPUs in order, decode instances first: `layout` gives each
instance its NPUs, and `instance_dies` its dies (ranks of its collectives, in that order), so the
simulator and the live driver put the same instance on the same devices.

`hardware` (model mode only) overrides figures of the hardware profile for a what-if study:
`{npu.hbm_bytes_per_s_per_die: 3.2e12}` or nested `{npu: {hbm_bytes_per_s_per_die: 3.2e12}}`
(emulator/model/overrides.py); `profile_of` gives the profile a deployment runs on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.overrides import apply_overrides
from cmemu.emulator.model.serving.lengths import Distribution, parse_distribution
from cmemu.emulator.model.serving.models import MODELS

SUPPORTED_VERSION = 1


@dataclass(frozen=True)
class Platform:
    description: str
    ub_across_servers: bool  # False: servers of node.npus NPUs joined only by RDMA


PLATFORMS: dict[str, Platform] = {
    "cm384": Platform("the supernode: every NPU reaches every other over UB", True),
    "cluster-roce": Platform(
        "the same NPUs in 8-NPU servers joined only by RDMA (model mode only)", False
    ),
}
ROUTERS = ("kv-aware", "prefix-aware", "round-robin")  # policies: emulator/model/serving/router.py
PLACEMENTS = ("static", "eplb", "ideal")  # ideal: every die carries the mean load
ADMISSIONS = ("reserve", "on-demand")  # decode HBM admission: emulator/model/serving/hbm.py


@dataclass(frozen=True, kw_only=True)
class DecodeSpec:
    instances: int = 1
    npus: int = 160
    ep: int = 0  # 0: every die of the instance
    max_batch_per_die: int = 48
    tpot_target_s: float = 0.05  # the SLO goodput is counted against
    mtp: bool = True
    microbatches: int = 2
    # reserve: a request holds the HBM of its final context from the start (never preempted);
    # on-demand: of its context so far, growing per token, the newest preempted to make room
    admission: str = "reserve"


@dataclass(frozen=True, kw_only=True)
class PrefillSpec:
    instances: int = 6
    npus: int = 16
    ep: int = 0
    batch_tokens: int = 16384
    microbatches: int = 2
    ttft_target_s: float = 2.0


@dataclass(frozen=True, kw_only=True)
class PdSpec:
    """Dynamic PD on the live router (`pd: dynamic`, or a mapping of these): the policy that
    moves instances between prefill and decode (emulator/model/serving/pdpolicy.py, POLICIES)
    and its figures, as `cmemu simulate pd` takes them. `fixed` keeps the split deployed."""

    policy: str = "fixed"
    interval_s: float = 30.0  # how often the policy decides
    window_s: float = 120.0  # the arrivals the demand is measured over
    horizon_s: float = 1800.0  # how long a new split is expected to serve
    headroom: float = 0.2  # capacity kept above the demand, per role


@dataclass(frozen=True, kw_only=True)
class EmsSpec:
    enabled: bool = True
    capacity_bytes: int = 0  # 0: the EMS DRAM share of the pools of the nodes in use


def _natural_output() -> Distribution:
    """Where requests end by themselves (the model's end-of-sequence token): lognormal, fitted
    to the output lengths of workloads/mooncake-synthetic.jsonl (geometric mean 50 tokens, sigma
    of the log 1.77), clipped to 1..8192."""
    return Distribution(kind="lognormal", mean=50.0, sigma=1.77, min=1, max=8192)


@dataclass(frozen=True, kw_only=True)
class Deployment:
    model: str = "deepseek-r1"
    platform: str = "cm384"
    preset: str = "cm384"  # the topology the instances are laid on
    decode: DecodeSpec = field(default_factory=DecodeSpec)
    prefill: PrefillSpec = field(default_factory=PrefillSpec)
    router: str = "kv-aware"
    ems: EmsSpec = field(default_factory=EmsSpec)
    placement: str = "static"
    # the output-length model: a request without max_tokens (or ignore_eos) ends where a draw
    # from it says, as a real model ends at its end-of-sequence token
    output: Distribution = field(default_factory=_natural_output)
    # hardware figures overridden for a what-if study (dotted name: value); model mode only
    hardware: dict[str, float] = field(default_factory=dict)
    pd: PdSpec = field(default_factory=PdSpec)  # live dynamic PD (off: fixed)

    def decode_dies(self, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
        return self.decode.npus * profile.npu.dies

    def prefill_dies(self, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
        return self.prefill.npus * profile.npu.dies

    def decode_ep(self, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
        return self.decode.ep or self.decode_dies(profile)

    def prefill_ep(self, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
        return self.prefill.ep or self.prefill_dies(profile)

    @property
    def npus(self) -> int:
        return self.decode.instances * self.decode.npus + self.prefill.instances * self.prefill.npus

    def decode_ids(self) -> list[str]:
        return [f"decode-{i}" for i in range(self.decode.instances)]

    def prefill_ids(self) -> list[str]:
        return [f"prefill-{i}" for i in range(self.prefill.instances)]


def _typed(value: Any, kind: type, where: str) -> Any:
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise InvalidArgumentError(f"{where} must be {kind.__name__}, got {value!r}", field=where)
    return value


def _section(raw: Any, cls: type, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(f"{where} must be a mapping", field=where)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown fields {unknown}; known: {sorted(known)}", field=where
        )
    defaults = cls()
    values = {k: _typed(v, type(getattr(defaults, k)), f"{where}.{k}") for k, v in raw.items()}
    return cls(**values)


def _positive(value: float, where: str, *, zero_ok: bool = False) -> None:
    if not (value > 0 or (zero_ok and value == 0)):
        raise InvalidArgumentError(f"{where} must be > 0, got {value}", field=where)


def parse_deployment(
    raw: Mapping[str, Any], profile: HardwareProfile = DEFAULT_PROFILE
) -> Deployment:
    """Validate a deployment document (from YAML or JSON) into a Deployment."""
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError("a deployment must be a mapping")
    body = dict(raw)
    version = body.pop("version", SUPPORTED_VERSION)
    if version != SUPPORTED_VERSION:
        raise InvalidArgumentError(
            f"deployment version {version!r} unsupported; expected {SUPPORTED_VERSION}",
            field="version",
        )
    sections = {"decode": DecodeSpec, "prefill": PrefillSpec, "ems": EmsSpec, "pd": PdSpec}
    if isinstance(body.get("pd"), str):  # `pd: dynamic`: the policy, its figures the defaults
        body["pd"] = {"policy": body["pd"]}
    known = set(Deployment.__dataclass_fields__)
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidArgumentError(
            f"unknown deployment fields {unknown}; known: {sorted(known | {'version'})}"
        )
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key in sections:
            values[key] = _section(value, sections[key], key)
        elif key == "output":
            values[key] = parse_distribution(value, key)
        elif key == "hardware":
            values[key] = _hardware(value, profile)
        else:
            values[key] = _typed(value, str, key)
    deployment = Deployment(**values)
    check_deployment(deployment, profile_of(deployment, profile))
    return deployment


def _flatten(raw: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten(value, f"{name}.", out)
        else:
            out[name] = value


def _hardware(raw: Any, profile: HardwareProfile) -> dict[str, float]:
    """The `hardware` section as {dotted name: value}, each checked against the profile."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError("hardware must be a mapping of figure: value", field="hardware")
    flat: dict[str, Any] = {}
    _flatten(raw, "", flat)
    applied = apply_overrides(profile, flat)
    return {name: float(_lookup(applied, name)) for name in flat}


def _lookup(profile: HardwareProfile, name: str) -> Any:
    section, key, *entry = name.split(".")
    value = getattr(getattr(profile, section), key)
    return value[entry[0]] if entry else value


def profile_of(d: Deployment, base: HardwareProfile = DEFAULT_PROFILE) -> HardwareProfile:
    """The profile a deployment runs on: `base` with its `hardware` overrides."""
    return apply_overrides(base, d.hardware) if d.hardware else base


def check_deployment(d: Deployment, profile: HardwareProfile) -> None:
    """Every field in range, on the hardware it will run on (after any overrides)."""
    tables: dict[str, tuple[str, Sequence[str]]] = {
        "model": (d.model, list(MODELS)),
        "platform": (d.platform, list(PLATFORMS)),
        "router": (d.router, ROUTERS),
        "placement": (d.placement, PLACEMENTS),
        "decode.admission": (d.decode.admission, ADMISSIONS),
    }
    for name, (value, known) in tables.items():
        if value not in known:
            raise UnknownNameError(name, value, known, field=name)
    for part, spec in (("decode", d.decode), ("prefill", d.prefill)):
        _positive(spec.instances, f"{part}.instances")
        _positive(spec.npus, f"{part}.npus")
        _positive(spec.microbatches, f"{part}.microbatches")
        if spec.microbatches > 2:
            raise InvalidArgumentError(
                f"{part}.microbatches must be 1 or 2", field=f"{part}.microbatches"
            )
        dies = spec.npus * profile.npu.dies
        if not 0 <= spec.ep <= dies or spec.ep == 1:
            raise InvalidArgumentError(
                f"{part}.ep must be 2..{dies} (the instance's dies) or 0 for all, got {spec.ep}",
                field=f"{part}.ep",
            )
    _positive(d.decode.max_batch_per_die, "decode.max_batch_per_die")
    _positive(d.decode.tpot_target_s, "decode.tpot_target_s")
    _positive(d.prefill.batch_tokens, "prefill.batch_tokens")
    _positive(d.prefill.ttft_target_s, "prefill.ttft_target_s")
    _positive(d.ems.capacity_bytes, "ems.capacity_bytes", zero_ok=True)
    _check_pd(d.pd)


def _check_pd(pd: PdSpec) -> None:
    from cmemu.emulator.model.serving.pdpolicy import POLICIES  # (pdpolicy imports this module)

    if pd.policy not in POLICIES:
        raise InvalidArgumentError(  # a bad field of the document, as a bad `decode.npus` is
            f"unknown pd.policy {pd.policy!r}; known: {', '.join(sorted(POLICIES))}",
            field="pd.policy",
        )
    for name in ("interval_s", "window_s", "horizon_s"):
        _positive(getattr(pd, name), f"pd.{name}")
    if not pd.headroom >= 0:
        raise InvalidArgumentError(
            f"pd.headroom must be >= 0, got {pd.headroom}", field="pd.headroom"
        )


def layout(d: Deployment, npus: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each instance's NPUs: decode instances first, then prefill, in the order of `npus` (the
    topology's NPUs)."""
    if d.npus > len(npus):
        raise InvalidArgumentError(
            f"the deployment needs {d.npus} NPUs, the platform has {len(npus)}", field="decode"
        )
    out: dict[str, tuple[str, ...]] = {}
    at = 0
    for ids, size in ((d.decode_ids(), d.decode.npus), (d.prefill_ids(), d.prefill.npus)):
        for instance in ids:
            out[instance] = tuple(npus[at : at + size])
            at += size
    return out


def instance_dies(
    npus: Sequence[str], profile: HardwareProfile = DEFAULT_PROFILE
) -> tuple[str, ...]:
    """An instance's dies in rank order: NPU by NPU, die 0 then die 1."""
    return tuple(die_id(n, k) for n in npus for k in range(profile.npu.dies))
