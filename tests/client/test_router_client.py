"""The typed router client (emulator/client/router.py) against a real cm-mini in this
process: the usage report as plain values, an unknown tenant refused as an EmulatorError."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.client.router import RouterClient
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini") as supernode:
        yield supernode


async def test_usage_before_any_request(mini: Supernode) -> None:
    report = await RouterClient(mini.clients).usage()
    assert report.at_ns > 0 and all(t.requests == 0 for t in report.tenants)


async def test_an_unknown_tenant_is_not_found(mini: Supernode) -> None:
    with pytest.raises(NotFoundError) as unknown:
        await RouterClient(mini.clients).usage("no-such-tenant")
    assert "no-such-tenant" in str(unknown.value)


async def test_deploy_get_list_undeploy(mini: Supernode) -> None:
    router = RouterClient(mini.clients)
    started = await router.deploy(
        "small",
        model="deepseek-r1",
        decode_npus=2,
        prefill=(1, 2),
        options={"decode.max_batch_per_die": "8", "decode.tpot_target_s": "1"},
    )
    assert started.name == "small" and started.state is not None and started.npus == 4
    assert started.weights.bytes > 0 and started.weights.load_ns > 0
    got = await router.get("small")
    assert got.name == "small" and {i.role for i in got.instances} == {"decode", "prefill"}
    assert [d.name for d in await router.list()] == ["small"]
    gone = await router.undeploy("small")
    assert (gone.name, gone.npus) == ("small", 4)
    with pytest.raises(NotFoundError):
        await router.get("small")


async def test_a_spec_with_a_shape_is_refused_before_any_call(mini: Supernode) -> None:
    with pytest.raises(InvalidArgumentError):
        await RouterClient(mini.clients).deploy(spec_yaml="model: x", model="deepseek-r1")


async def test_the_serving_aggregates_as_plain_values(mini: Supernode) -> None:
    stats = await RouterClient(mini.clients, timeout_s=30.0).stats()
    assert stats.requests_dropped == 0 and stats.requests_failed == 0
    assert stats.ttft.count == stats.requests_completed and stats.ttft.p50_ns >= 0
