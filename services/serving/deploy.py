"""Bringing a deployment up on the live supernode, and taking it down.

Deploy: parse the spec (the model's `parse_deployment`), ask the scheduler for each instance's
NPUs, place the experts on its dies (emulator/model/serving/placement.py), reserve a KV region on
each decode NPU (prefill -> decode KV caches land there), and load the weights through EMS:
size-only WEIGHTS objects, cold from object storage the first time, from EMS once cached, each
taking the emulated time of the profile's model-caching figures. Then the engine and its live
driver start. Undeploy reverses it; the weights and KV blocks stay cached in EMS.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cmemu.emulator.client.ems import EmsClient, ObjectKind
from cmemu.emulator.client.scheduler import SchedulerClient
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.serving.deployment import (
    Deployment,
    PdSpec,
    instance_dies,
    parse_deployment,
)
from cmemu.emulator.model.serving.experts import imbalance
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.pdpolicy import live_options, unit_rates
from cmemu.emulator.model.serving.placement import ExpertPlacement, layout, place, remap
from cmemu.emulator.model.topology import Topology
from cmemu.services.peers import Peers
from cmemu.services.rpc import RemoteError
from cmemu.services.serving.driver import Driver
from cmemu.services.serving.measures import LiveInstance
from cmemu.v1 import router_pb2

NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,46}[a-z0-9])?$")
LIVE_PLATFORM = "cm384"  # the live supernode is UB everywhere; cluster-roce is model mode only
WEIGHTS_KIND = ObjectKind.WEIGHTS
DEVICE_DEADLINE_S = 5.0  # a region allocated or given back on an NPU: a hung one is given up on


def spec_dict(request: router_pb2.DeployRequest) -> dict[str, Any]:
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


def _fields_doc(request: router_pb2.DeployRequest) -> dict[str, Any]:
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


def parse_request(
    request: router_pb2.DeployRequest, topology: Topology, profile: HardwareProfile
) -> tuple[str, Deployment]:
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


@dataclass(frozen=True, kw_only=True)
class WeightPlan:
    bytes: int
    shards: tuple[tuple[str, int], ...]  # EMS key and size of each
    cold_s: float
    from_ems_s: float


def weight_plan(deployment: Deployment, profile: HardwareProfile) -> WeightPlan:
    """The weights as EMS objects (at most object_max_bytes each) and how long loading every
    instance's copy takes, scaled from the published model-caching point."""
    s = profile.serving
    total = int(s.cache_weights_bytes)
    count = math.ceil(total / profile.ems.object_max_bytes)
    base, extra = divmod(total, count)
    shards = tuple(
        (f"weights/{deployment.model}/{i:03d}-of-{count:03d}", base + (1 if i < extra else 0))
        for i in range(count)
    )
    instances = deployment.decode.instances + deployment.prefill.instances
    scale = instances / s.cache_instances
    return WeightPlan(
        bytes=total,
        shards=shards,
        cold_s=s.cache_cold_s * scale,
        from_ems_s=s.cache_from_ems_s * scale,
    )


def zipf(n: int, exponent: float) -> list[float]:
    return [1.0 / (k + 1) ** exponent for k in range(n)]


@dataclass(kw_only=True)
class LiveDeployment:
    """One deployment's resources and state, as GetDeployment reports it."""

    name: str
    spec: Deployment
    spec_yaml: str
    created_ns: int
    state: router_pb2.DeploymentState.ValueType = router_pb2.DEPLOYMENT_STATE_LOADING
    error: str = ""
    instances: list[LiveInstance] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    placements: dict[str, ExpertPlacement] = field(default_factory=dict)
    imbalance: dict[str, float] = field(default_factory=dict)  # what the cost model charges
    allocations: dict[str, str] = field(default_factory=dict)  # instance -> scheduler job
    regions: list[tuple[str, int]] = field(default_factory=list)  # (npu, region id)
    weights: WeightPlan | None = None
    weights_source: str = ""
    loaded_ns: int = 0
    driver: Driver | None = None
    pd: Callable[[], router_pb2.PdStatus] | None = None  # live dynamic PD's status, when on

    def message(self) -> router_pb2.Deployment:
        msg = router_pb2.Deployment(
            name=self.name,
            model=self.spec.model,
            state=self.state,
            created_ns=self.created_ns,
            error=self.error,
            spec_yaml=self.spec_yaml,
            npus=sum(len(i.npus) for i in self.instances),
        )
        driver = self.driver
        instances = list(driver.instances.values()) if driver is not None else self.instances
        for inst in instances:
            p = self.placements.get(inst.id)
            charged = self.imbalance.get(inst.id, 1.0)
            if driver is not None and p is not None and driver.engine.remapped(inst.id):
                # the live placement without its lost dies, at what the engine charges now
                lost = driver.engine.isolated().get(inst.id, ())
                p = remap(p, [p.dies[i] for i in lost if i < len(p.dies)]).placement
                charged = driver.engine.imbalance(inst.id)
            msg.instances.append(
                router_pb2.Instance(
                    id=inst.id,
                    role=self.roles[inst.id],
                    npus=[d.id for d in inst.npus],
                    dies=len(inst.dies),
                    allocation=self.allocations.get(inst.id, ""),
                    experts=_experts(p, charged) if p is not None else None,
                )
            )
        if driver is not None:
            h = driver.isolation.health()
            msg.failed_dies.extend(h.failed_dies)
            msg.last_isolated_ns = h.last_isolated_ns
            msg.last_restored_ns = h.last_restored_ns
            msg.health = h.health
        if self.pd is not None:
            msg.pd.CopyFrom(self.pd())
        if self.weights is not None:
            msg.weights.CopyFrom(
                router_pb2.WeightLoading(
                    bytes=self.weights.bytes,
                    source=self.weights_source,
                    cold_ns=round(self.weights.cold_s * 1e9),
                    from_ems_ns=round(self.weights.from_ems_s * 1e9),
                    loaded_ns=self.loaded_ns,
                )
            )
        return msg


def _experts(p: ExpertPlacement, charged: float) -> router_pb2.ExpertSummary:
    s = p.summary()
    return router_pb2.ExpertSummary(
        policy=p.policy,
        slots_per_die=int(s["slots_per_die"]),
        shared=int(s["shared"]),
        routed=int(s["routed"]),
        redundant=int(s["redundant"]),
        imbalance=charged,
        ep=len(p.dies),
    )


def spec_text(deployment: Deployment) -> str:
    """The deployment as a YAML document (what `--deployment FILE` takes)."""
    import yaml  # imported when used: a boot that never parses YAML loads none

    doc = asdict(deployment)
    if deployment.pd == PdSpec():  # off: the document as it was before live dynamic PD
        del doc["pd"]
    return yaml.safe_dump({"version": 1, **doc}, sort_keys=False)


def remote(exc: EmulatorError, what: str) -> RemoteError:
    """A peer service's refusal, as this service relays it: its status, prefixed with who."""
    return RemoteError.from_error(exc, what)


class Provisioner:
    """Scheduler allocations, expert placement, KV regions and weights for one deployment."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        peers: Peers,
        scheduler_address: str,
        ems_address: str,
    ) -> None:
        self.topology = topology
        self.profile = profile
        self.peers = peers
        self.scheduler = SchedulerClient(peers.channel(scheduler_address))
        self.ems = EmsClient(peers.channel(ems_address))

    async def allocate(self, live: LiveDeployment) -> None:
        """Every instance's NPUs, all or nothing (a refusal gives back what was taken)."""
        spec = live.spec
        sizes = [(i, "decode", spec.decode.npus) for i in spec.decode_ids()] + [
            (i, "prefill", spec.prefill.npus) for i in spec.prefill_ids()
        ]
        try:
            for instance, role, npus in sizes:
                job = f"{live.name}.{instance}"
                try:
                    allocation = await self.scheduler.allocate(job, npus)
                except EmulatorError as exc:
                    raise remote(exc, f"scheduler ({instance}: {npus} NPUs)") from exc
                live.allocations[instance] = job
                devices = tuple(self.topology.device(n.id) for n in allocation.npus)
                live.roles[instance] = role
                live.instances.append(
                    LiveInstance(
                        id=instance,
                        npus=devices,
                        dies=instance_dies([d.id for d in devices], self.profile),
                    )
                )
            self._place(live)
            await self._kv_regions(live)
        except BaseException:
            await self.release(live)
            raise

    def _place(self, live: LiveDeployment) -> None:
        """Each instance's experts over its expert-parallel group (its first `ep` dies), and
        the imbalance the engine's cost model charges for that placement."""
        for inst in live.instances:
            self.place(live, inst)

    def place(self, live: LiveDeployment, inst: LiveInstance) -> None:
        """One instance's experts, for the role it has now."""
        model = get_model(live.spec.model)
        s = self.profile.serving
        histogram = zipf(model.routed_experts, s.expert_load_zipf)
        decode = live.roles[inst.id] == "decode"
        ep = live.spec.decode_ep(self.profile) if decode else live.spec.prefill_ep(self.profile)
        shape = layout(
            dies=ep,
            routed_experts=model.routed_experts,
            shared_fraction=s.shared_slot_fraction,
            redundant_fraction=s.redundant_slot_fraction,
        )
        live.placements[inst.id] = place(
            shape, inst.dies[:ep], policy=live.spec.placement, histogram=histogram
        )
        live.imbalance[inst.id] = imbalance(model, ep, live.spec.placement, self.profile)

    async def _kv_regions(self, live: LiveDeployment) -> None:
        """A KV region (one die's HBM) on each decode NPU, where prefill KV caches land."""
        for k, inst in enumerate(live.instances):
            if live.roles[inst.id] == "decode":
                live.instances[k] = await self.kv_region(live, inst)

    async def kv_region(self, live: LiveDeployment, inst: LiveInstance) -> LiveInstance:
        """`inst` with a KV region on each of its NPUs (recorded in `live.regions`)."""
        size = self.profile.npu.hbm_bytes_per_die
        offsets = []
        for npu in inst.npus:
            region = await self.peers.device(npu).allocate(
                size, f"kv/{live.name}", deadline_s=DEVICE_DEADLINE_S
            )
            live.regions.append((npu.id, region.region_id))
            offsets.append(region.offset)
        return LiveInstance(id=inst.id, npus=inst.npus, dies=inst.dies, kv_offsets=tuple(offsets))

    async def plan_weights(self, live: LiveDeployment) -> None:
        """Which source the weights load from: EMS when every shard is cached, else cold."""
        plan = live.weights = weight_plan(live.spec, self.profile)
        keys = [k for k, _ in plan.shards]
        try:
            present = await self.ems.exist(keys)
        except EmulatorError as exc:
            raise remote(exc, "ems") from exc
        live.weights_source = "ems" if all(present) else "cold"

    async def stage_weights(self, live: LiveDeployment) -> None:
        """A warm start: every shard into EMS now, as if cached by an earlier load (size-only
        objects; the time an earlier load took is not this deployment's)."""
        plan = weight_plan(live.spec, self.profile)
        source = live.instances[0].npus[0].id
        try:
            for key, size in plan.shards:  # one at a time: each is a whole pool's worth of writes
                await self.ems.put(key, size=size, kind=WEIGHTS_KIND, device=source)
        except EmulatorError as exc:
            raise remote(exc, "ems (weights)") from exc

    async def load_weights(self, live: LiveDeployment) -> float:
        """Cache the shards EMS lacks (a cold load fills it); the emulated loading time."""
        plan = live.weights
        assert plan is not None
        present = await self.ems.exist([k for k, _ in plan.shards])
        source = live.instances[0].npus[0].id
        for (key, size), there in zip(plan.shards, present, strict=True):
            if there:
                continue
            try:  # one at a time: each is a whole pool's worth of writes
                await self.ems.put(key, size=size, kind=WEIGHTS_KIND, device=source)
            except EmulatorError as exc:
                raise remote(exc, "ems (weights)") from exc
        return plan.cold_s if live.weights_source == "cold" else plan.from_ems_s

    async def release(self, live: LiveDeployment) -> None:
        """Give back the KV regions and every allocation (what is already gone is skipped)."""
        for npu, region_id in live.regions:
            with contextlib.suppress(EmulatorError):  # what is already gone is skipped
                await self.peers.device(self.topology.device(npu)).free(
                    region_id, deadline_s=DEVICE_DEADLINE_S
                )
        live.regions.clear()
        for job in live.allocations.values():
            try:
                await self.scheduler.release(job)
            except NotFoundError:
                pass
            except EmulatorError as exc:
                raise remote(exc, "scheduler") from exc
        live.allocations.clear()
