"""The router of a running emulator as a program (or `cmemu serve-model|deployments|undeploy|
usage`) calls it: deploy, get, list and undeploy deployments (emulator/client/deployments.py),
and what each tenant of the OpenAI endpoint used, with plain values in and out. Every failure is
the EmulatorError its status names, the server's message unprefixed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.deployments import Deployment, deployment
from cmemu.emulator.client.servingstats import ServingStats, serving_stats
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.engines.serving.usage import TenantUse
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.v1 import router_pb2, router_pb2_grpc


@dataclass(frozen=True, kw_only=True)
class UsageReport:
    """Every tenant's use of the router at one emulated instant."""

    tenants: tuple[TenantUse, ...]
    at_ns: int  # the emulated instant of the report


class RouterClient:
    """The router of `clients`' supernode, over its channels (not closed here)."""

    def __init__(self, clients: Clients, *, timeout_s: float | None = None) -> None:
        """`timeout_s`: every call's wall deadline (None: none), for a caller that must go on
        when the service hangs (the chaos runner's status polls)."""
        self._timeout_s = timeout_s
        address = clients.topology.service(ServiceKind.ROUTER).address
        self._stub = router_pb2_grpc.RouterStub(clients.channel_to(address))

    async def deploy(
        self,
        name: str = "",
        *,
        model: str = "",
        spec_yaml: str = "",
        decode_npus: int = 0,
        prefill: tuple[int, int] | None = None,
        options: Mapping[str, str] | None = None,
        warm: bool = False,
        wait: bool = False,
    ) -> Deployment:
        """Deploy a model (its shape from `decode_npus`, `prefill` (K instances of M NPUs) and
        `options`) or a whole `spec_yaml` document. Returns at once, LOADING: follow it with
        `get`; or, with `wait`, once it serves or failed. `warm`: its weights already in EMS."""
        if spec_yaml and (model or decode_npus or prefill or options):
            raise InvalidArgumentError(
                "spec_yaml replaces model, decode_npus, prefill and options", field="spec_yaml"
            )
        request = router_pb2.DeployRequest(name=name, warm=warm, wait=wait)
        if spec_yaml:
            request.spec_yaml = spec_yaml
        else:
            request.model = model
            request.decode_npus = decode_npus
            if prefill is not None:
                request.prefill_instances, request.prefill_npus = prefill
            for key, value in (options or {}).items():
                request.options[key] = value
        return deployment(await reply_of(None, self._stub.Deploy(request, timeout=self._timeout_s)))

    async def get(self, name: str) -> Deployment:
        request = router_pb2.GetDeploymentRequest(name=name)
        return deployment(
            await reply_of(None, self._stub.GetDeployment(request, timeout=self._timeout_s))
        )

    async def list(self) -> list[Deployment]:
        request = router_pb2.ListDeploymentsRequest()
        listed = await reply_of(None, self._stub.ListDeployments(request, timeout=self._timeout_s))
        return [deployment(d) for d in listed.deployments]

    async def undeploy(self, name: str) -> Deployment:
        """Stop a deployment and release its NPUs: the deployment as it was left."""
        request = router_pb2.UndeployRequest(name=name)
        return deployment(
            await reply_of(None, self._stub.Undeploy(request, timeout=self._timeout_s))
        )

    async def stats(self) -> ServingStats:
        """The serving aggregates of every deployment: latencies, tokens, requests lost."""
        request = router_pb2.GetStatsRequest()
        return serving_stats(
            await reply_of(None, self._stub.GetStats(request, timeout=self._timeout_s))
        )

    async def usage(self, tenant: str = "") -> UsageReport:
        """Every tenant's usage, or `tenant`'s only."""
        request = router_pb2.GetUsageRequest(tenant=tenant)
        m = await reply_of(None, self._stub.GetUsage(request, timeout=self._timeout_s))
        return UsageReport(
            tenants=tuple(
                TenantUse(
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
                for t in m.tenants
            ),
            at_ns=m.at_ns,
        )
