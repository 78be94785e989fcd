"""cmemu.v1.Router's messages and the serving engine's values (services/serving/wire.py): what
the engine reports comes back through the wire and the typed client as the same model values
(emulator/model/serving/live.py), every field of them, and every state has its wire value."""

from __future__ import annotations

import dataclasses

import pytest

from cmemu.emulator.client.deployments import deployment
from cmemu.emulator.client.servingstats import serving_stats
from cmemu.emulator.engines.serving.deploy import LiveDeployment
from cmemu.emulator.engines.serving.spec import DeployAsk, spec_text
from cmemu.emulator.engines.serving.stats import DeploymentStats, RequestMetrics, summarize
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.live import DeploymentState, PdStatus, PdSwitch
from cmemu.services.serving.wire import WIRE_STATE, deploy_ask, deployment_message, stats_message
from cmemu.v1 import router_pb2


def _stats() -> DeploymentStats:
    """Two deployments' requests: completed, failed and cancelled, retried, some in flight."""
    one, two = (
        DeploymentStats(in_flight=2, lookup_tokens=40, kv_slots_held=3, kv_slots=8),
        (DeploymentStats(retried=1, dropped=1, kv_slots=8)),
    )
    for k in range(3):
        one.record(
            RequestMetrics(
                request_id=f"r{k}", arrival_ns=1_000 * k, prompt_tokens=10 + k,
                prefill_start_ns=1_000 * k + 50, first_token_ns=1_000 * k + 300 + k,
                last_token_ns=1_000 * k + 900 + 7 * k, completion_tokens=4 + k,
                prefix_hit_tokens=8,
            )
        )  # fmt: skip
    two.record(RequestMetrics(request_id="f", arrival_ns=5, prompt_tokens=3, failed=True))
    two.record(RequestMetrics(request_id="c", arrival_ns=9, prompt_tokens=2, cancelled=True))
    return DeploymentStats(
        finished=[*one.finished, *two.finished],
        in_flight=one.in_flight,
        lookup_tokens=one.lookup_tokens,
        kv_slots_held=one.kv_slots_held,
        kv_slots=one.kv_slots + two.kv_slots,
        retried=two.retried,
        dropped=two.dropped,
    )


def test_the_serving_aggregates_come_back_whole() -> None:
    value = summarize([_stats()])
    # every figure is set, so a field the wire or the client dropped would read back as 0
    unset = [f.name for f in dataclasses.fields(value) if not getattr(value, f.name)]
    assert not unset
    assert serving_stats(stats_message(value)) == value


def test_its_twin_no_requests_is_all_zeros_on_the_wire() -> None:
    value = summarize([DeploymentStats()])
    assert stats_message(value) == router_pb2.ServingStats(
        ttft=router_pb2.Percentiles(),
        tpot=router_pb2.Percentiles(),
        queueing=router_pb2.Percentiles(),
    )
    assert serving_stats(stats_message(value)) == value


@pytest.mark.parametrize("state", list(DeploymentState))
def test_a_deployment_and_its_pd_come_back_in_every_state(state: DeploymentState) -> None:
    spec = parse_deployment({"model": "deepseek-r1", "preset": "cm-mini"}, DEFAULT_PROFILE)
    pd = PdStatus(
        policy="threshold",
        prefill_units=1,
        decode_units=2,
        switching_units=1,
        switches=(PdSwitch(at_ns=5, to="decode", instances=("prefill-1",), joined_ns=9),),
        prefill_share=0.25,
    )
    live = LiveDeployment(
        name="w", spec=spec, spec_yaml=spec_text(spec), created_ns=3, state=state, pd=lambda: pd
    )
    msg = deployment_message(live)
    assert msg.state == WIRE_STATE[state] != router_pb2.DEPLOYMENT_STATE_UNSPECIFIED
    back = deployment(msg)
    assert (back.state, back.pd, back.name, back.created_ns) == (state, pd, "w", 3)
    # without dynamic PD, none comes back
    assert deployment(deployment_message(dataclasses.replace(live, pd=None))).pd is None


def test_a_deploy_request_reads_as_its_ask() -> None:
    request = router_pb2.DeployRequest(
        name="n", model="m", decode_npus=4, prefill_instances=2, prefill_npus=3,
        options={"placement": "eplb"}, spec_yaml="y", wait=True, warm=True,
    )  # fmt: skip
    assert deploy_ask(request) == DeployAsk(
        name="n", model="m", decode_npus=4, prefill_instances=2, prefill_npus=3,
        options={"placement": "eplb"}, spec_yaml="y", wait=True, warm=True,
    )  # fmt: skip
    assert deploy_ask(router_pb2.DeployRequest()) == DeployAsk()
