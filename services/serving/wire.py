"""cmemu.v1.Router's messages to and from the serving engine's values (emulator/engines/serving/):
a Deploy request as a `DeployAsk`, a deployment, its dynamic PD and the serving aggregates as
their messages, and the tenants' metered use (the serving engine's usage meter) as a UsageReport."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cmemu.emulator.client.servingstats import stats_message as stats_message  # noqa: PLC0414
from cmemu.emulator.engines.serving.spec import DeployAsk
from cmemu.emulator.engines.serving.usage import TenantUse
from cmemu.emulator.model.serving.live import DeploymentState, PdStatus
from cmemu.v1 import router_pb2

if TYPE_CHECKING:  # the serving engine's deployments: imported with their first (deploy.py)
    from cmemu.emulator.engines.serving.deploy import InstanceView, LiveDeployment

WIRE_STATE = {
    DeploymentState.LOADING: router_pb2.DEPLOYMENT_STATE_LOADING,
    DeploymentState.SERVING: router_pb2.DEPLOYMENT_STATE_SERVING,
    DeploymentState.FAILED: router_pb2.DEPLOYMENT_STATE_FAILED,
    DeploymentState.STOPPED: router_pb2.DEPLOYMENT_STATE_STOPPED,
}


def deploy_ask(m: router_pb2.DeployRequest) -> DeployAsk:
    return DeployAsk(
        name=m.name,
        model=m.model,
        decode_npus=m.decode_npus,
        prefill_instances=m.prefill_instances,
        prefill_npus=m.prefill_npus,
        options=dict(m.options),
        spec_yaml=m.spec_yaml,
        wait=m.wait,
        warm=m.warm,
    )


def deployment_message(live: LiveDeployment) -> router_pb2.Deployment:
    msg = router_pb2.Deployment(
        name=live.name,
        model=live.spec.model,
        state=WIRE_STATE[live.state],
        created_ns=live.created_ns,
        error=live.error,
        spec_yaml=live.spec_yaml,
        npus=live.npus,
    )
    msg.instances.extend(_instance(view) for view in live.views())
    h = live.health()
    if h is not None:
        msg.failed_dies.extend(h.failed_dies)
        msg.last_isolated_ns = h.last_isolated_ns
        msg.last_restored_ns = h.last_restored_ns
        msg.health = h.health
    if live.pd is not None:
        msg.pd.CopyFrom(pd_message(live.pd()))
    if live.weights is not None:
        msg.weights.CopyFrom(
            router_pb2.WeightLoading(
                bytes=live.weights.bytes,
                source=live.weights_source,
                cold_ns=round(live.weights.cold_s * 1e9),
                from_ems_ns=round(live.weights.from_ems_s * 1e9),
                loaded_ns=live.loaded_ns,
            )
        )
    return msg


def _instance(view: InstanceView) -> router_pb2.Instance:
    inst, p = view.instance, view.placement
    experts = None
    if p is not None:
        s = p.summary()
        experts = router_pb2.ExpertSummary(
            policy=p.policy,
            slots_per_die=int(s["slots_per_die"]),
            shared=int(s["shared"]),
            routed=int(s["routed"]),
            redundant=int(s["redundant"]),
            imbalance=view.imbalance,
            ep=len(p.dies),
        )
    return router_pb2.Instance(
        id=inst.id,
        role=view.role,
        npus=[d.id for d in inst.npus],
        dies=len(inst.dies),
        allocation=view.allocation,
        experts=experts,
    )


def pd_message(status: PdStatus) -> router_pb2.PdStatus:
    return router_pb2.PdStatus(
        policy=status.policy,
        prefill_units=status.prefill_units,
        decode_units=status.decode_units,
        switching_units=status.switching_units,
        prefill_share=status.prefill_share,
        switches=[
            router_pb2.PdSwitch(
                at_ns=w.at_ns, to=w.to, instances=w.instances, joined_ns=w.joined_ns
            )
            for w in status.switches
        ],
    )


def usage_report(tenants: list[TenantUse], now_ns: int) -> router_pb2.UsageReport:
    """The tenants' metered use (the serving engine's UsageMeter) as a UsageReport."""
    return router_pb2.UsageReport(
        at_ns=now_ns,
        tenants=[
            router_pb2.TenantUsage(
                tenant=t.tenant,
                priority=t.priority,
                requests=t.requests,
                prompt_tokens=t.prompt_tokens,
                cached_tokens=t.cached_tokens,
                completion_tokens=t.completion_tokens,
                total_tokens=t.total_tokens,
                rejected=t.rejected,
                quota_tokens=t.quota_tokens,
            )
            for t in tenants
        ],
    )
