"""The router's deployments as plain values (cmemu.v1.Deployment and its parts, read back from
the wire): what emulator/client/router.py's RouterClient returns for deploy, get, list and
undeploy."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.serving.live import DeploymentState as DeploymentState  # noqa: PLC0414
from cmemu.emulator.model.serving.live import PdStatus as PdStatus  # noqa: PLC0414
from cmemu.emulator.model.serving.live import PdSwitch as PdSwitch  # noqa: PLC0414
from cmemu.v1 import router_pb2

STATE_OF = {
    router_pb2.DEPLOYMENT_STATE_LOADING: DeploymentState.LOADING,
    router_pb2.DEPLOYMENT_STATE_SERVING: DeploymentState.SERVING,
    router_pb2.DEPLOYMENT_STATE_FAILED: DeploymentState.FAILED,
    router_pb2.DEPLOYMENT_STATE_STOPPED: DeploymentState.STOPPED,
}


@dataclass(frozen=True, kw_only=True)
class ExpertSummary:
    """How an instance's experts are placed over its dies, and how unevenly they are loaded."""

    policy: str  # the placement policy ("static", "eplb")
    slots_per_die: int
    shared: int
    routed: int
    redundant: int
    imbalance: float  # busiest die's routed load over the mean
    ep: int  # expert-parallel degree


@dataclass(frozen=True, kw_only=True)
class Instance:
    """One prefill or decode instance of a deployment, on the NPUs the scheduler allocated it."""

    id: str  # "decode-0", "prefill-2"
    role: str  # "decode" or "prefill"
    npus: tuple[str, ...]
    dies: int
    experts: ExpertSummary
    allocation: str  # the scheduler's allocation id


@dataclass(frozen=True, kw_only=True)
class WeightLoading:
    """Where a deployment's weights come from (object storage or EMS) and when they are loaded."""

    bytes: int
    source: str  # "cold" (object storage) or "ems" (already cached)
    cold_ns: int
    from_ems_ns: int
    loaded_ns: int  # 0 while loading

    @property
    def load_ns(self) -> int:
        """What this load takes, from where it comes."""
        return self.from_ems_ns if self.source == "ems" else self.cold_ns


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """A serving deployment as the router reports it: its instances, its weights' loading and its
    state."""

    name: str
    model: str
    state: DeploymentState | None  # None: a state this client does not know
    instances: tuple[Instance, ...]
    weights: WeightLoading
    created_ns: int
    error: str
    spec_yaml: str
    npus: int
    failed_dies: tuple[str, ...]
    last_isolated_ns: int
    last_restored_ns: int
    health: str  # serving | degraded | recovering; empty until it serves
    pd: PdStatus | None  # None: a fixed split


def deployment(m: router_pb2.Deployment) -> Deployment:
    w, p = m.weights, m.pd
    return Deployment(
        name=m.name,
        model=m.model,
        state=STATE_OF.get(m.state),
        instances=tuple(_instance(i) for i in m.instances),
        weights=WeightLoading(
            bytes=w.bytes,
            source=w.source,
            cold_ns=w.cold_ns,
            from_ems_ns=w.from_ems_ns,
            loaded_ns=w.loaded_ns,
        ),
        created_ns=m.created_ns,
        error=m.error,
        spec_yaml=m.spec_yaml,
        npus=m.npus,
        failed_dies=tuple(m.failed_dies),
        last_isolated_ns=m.last_isolated_ns,
        last_restored_ns=m.last_restored_ns,
        health=m.health,
        pd=PdStatus(
            policy=p.policy,
            prefill_units=p.prefill_units,
            decode_units=p.decode_units,
            switching_units=p.switching_units,
            switches=tuple(
                PdSwitch(
                    at_ns=s.at_ns, to=s.to, instances=tuple(s.instances), joined_ns=s.joined_ns
                )
                for s in p.switches
            ),
            prefill_share=p.prefill_share,
        )
        if m.HasField("pd")
        else None,
    )


def _instance(i: router_pb2.Instance) -> Instance:
    e = i.experts
    return Instance(
        id=i.id,
        role=i.role,
        npus=tuple(i.npus),
        dies=i.dies,
        experts=ExpertSummary(
            policy=e.policy,
            slots_per_die=e.slots_per_die,
            shared=e.shared,
            routed=e.routed,
            redundant=e.redundant,
            imbalance=e.imbalance,
            ep=e.ep,
        ),
        allocation=i.allocation,
    )
