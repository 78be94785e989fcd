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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import answer_within
from cmemu.emulator.engines.peers import Directory, JobScheduler
from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.engines.serving.isolation import Health
from cmemu.emulator.engines.serving.measures import LiveInstance
from cmemu.emulator.engines.serving.peers import KvStore
from cmemu.emulator.model.ems.objects import ObjectKind
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, relayed
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.memory import Region
from cmemu.emulator.model.serving.deployment import Deployment, instance_dies
from cmemu.emulator.model.serving.experts import imbalance
from cmemu.emulator.model.serving.live import DeploymentState, PdStatus
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.placement import ExpertPlacement, layout, place, remap
from cmemu.emulator.model.topology import Device, Topology

T = TypeVar("T")
WEIGHTS_KIND = ObjectKind.WEIGHTS


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
    state: DeploymentState = DeploymentState.LOADING
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
    pd: Callable[[], PdStatus] | None = None  # live dynamic PD's status, when on

    @property
    def npus(self) -> int:
        """The NPUs it was given (the instances' at deploy)."""
        return sum(len(i.npus) for i in self.instances)

    def views(self) -> list[InstanceView]:
        """Each instance as it is now: its NPUs (a replacement's, once restored), and its
        experts' placement without its lost dies, at what the engine charges now."""
        driver = self.driver
        instances = list(driver.instances.values()) if driver is not None else self.instances
        out = []
        for inst in instances:
            p = self.placements.get(inst.id)
            charged = self.imbalance.get(inst.id, 1.0)
            if driver is not None and p is not None and driver.engine.remapped(inst.id):
                lost = driver.engine.isolated().get(inst.id, ())
                p = remap(p, [p.dies[i] for i in lost if i < len(p.dies)]).placement
                charged = driver.engine.imbalance(inst.id)
            out.append(
                InstanceView(
                    instance=inst,
                    role=self.roles[inst.id],
                    allocation=self.allocations.get(inst.id, ""),
                    placement=p,
                    imbalance=charged,
                )
            )
        return out

    def health(self) -> Health | None:
        """Its faults (None until its driver runs)."""
        return self.driver.isolation.health() if self.driver is not None else None


@dataclass(frozen=True, kw_only=True)
class InstanceView:
    """One instance of a deployment as GetDeployment reports it."""

    instance: LiveInstance
    role: str
    allocation: str  # the scheduler's job holding its NPUs
    placement: ExpertPlacement | None
    imbalance: float  # what the engine charges for the placement now


class Provisioner:
    """Scheduler allocations, expert placement, KV regions and weights for one deployment."""

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Directory,
        scheduler: JobScheduler,
        ems: KvStore,
    ) -> None:
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.scheduler = scheduler
        self.ems = ems

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
                    raise relayed(exc, f"scheduler ({instance}: {npus} NPUs)") from exc
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
            region = await self.allocate_region(npu, size, f"kv/{live.name}")
            live.regions.append((npu.id, region.region_id))
            offsets.append(region.offset)
        return LiveInstance(id=inst.id, npus=inst.npus, dies=inst.dies, kv_offsets=tuple(offsets))

    async def allocate_region(self, npu: Device, size: int, label: str) -> Region:
        """A region on `npu`; a hung NPU is given up on (DeadlineExceededError) after
        `serving.kv_region_timeout_s` of emulated time (engines/deadline.py: a wall bound fails
        healthy NPUs on a starved host), never under the serving bounds' wall floor."""
        call = self.peers.device(npu).allocate(size, label, deadline_s=None)
        return await self._answer(npu, call)

    async def free_region(self, npu: Device, region_id: int) -> int:
        """A region of `npu` given back, bounded as `allocate_region` is."""
        return await self._answer(npu, self.peers.device(npu).free(region_id, deadline_s=None))

    async def _answer(self, npu: Device, call: Awaitable[T]) -> T:
        s = self.profile.serving
        return await answer_within(
            self.clock.clock, s.kv_region_timeout_s, call,
            peer=npu.id, min_wall_s=s.step_deadline_min_wall_s,
        )  # fmt: skip

    async def plan_weights(self, live: LiveDeployment) -> None:
        """Which source the weights load from: EMS when every shard is cached, else cold."""
        plan = live.weights = weight_plan(live.spec, self.profile)
        keys = [k for k, _ in plan.shards]
        try:
            present = await self.ems.exist(keys)
        except EmulatorError as exc:
            raise relayed(exc, "ems") from exc
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
            raise relayed(exc, "ems (weights)") from exc

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
                raise relayed(exc, "ems (weights)") from exc
        return plan.cold_s if live.weights_source == "cold" else plan.from_ems_s

    async def release(self, live: LiveDeployment) -> None:
        """Give back the KV regions and every allocation (what is already gone is skipped)."""
        for npu, region_id in live.regions:
            with contextlib.suppress(EmulatorError):  # what is already gone is skipped
                await self.free_region(self.topology.device(npu), region_id)
        live.regions.clear()
        for job in live.allocations.values():
            try:
                await self.scheduler.release(job)
            except NotFoundError:
                pass
            except EmulatorError as exc:
                raise relayed(exc, "scheduler") from exc
        live.allocations.clear()
