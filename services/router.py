"""The router service: cmemu.v1.Router deploys, lists and undeploys on the live supernode, and
the OpenAI-compatible HTTP endpoint (services/serving/openai_http.py) at the service's
`http_address` takes requests. Both only translate: the deployments, their drivers and their
recovery are the serving engine's (emulator/engines/serving/), the messages services/serving/
wire.py's.
"""

from __future__ import annotations

import asyncio

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.serving.engine import ServingEngine
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.services.auth import OPEN
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, rpc
from cmemu.services.serving.openai_http import OpenAiServer
from cmemu.services.serving.wire import (
    deploy_ask,
    deployment_message,
    stats_message,
    usage_report,
)
from cmemu.v1 import router_pb2, router_pb2_grpc

SERVICE = "cmemu.v1.Router"
log = structlog.get_logger("cmemu.router")


class RouterState:
    """The serving engine and the HTTP endpoint before it; `run` runs the engine, then stops the
    endpoint `open_http` started."""

    name = "router"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Peers,
        events: EventSink | None,
        http_address: str | None,
    ) -> None:
        self.clock = clock
        self.http_address = http_address
        # the scheduler and EMS: their engines when this process hosts them, else their typed
        # clients over the shared channels; the NPUs, the fabric and the gateway the same way
        self.engine = ServingEngine(
            topology=topology,
            profile=profile,
            clock=clock,
            peers=peers,
            scheduler=peers.job_scheduler(),
            ems=peers.kv_store(),
            events=events,
        )
        self.outage = self.engine.outage  # what runtime/servicecontrol.py sets on service-down
        self.http = (
            OpenAiServer(router=self.engine, profile=profile, clock=clock.clock)
            if http_address
            else None
        )
        if self.http is not None:  # a deployment's requests will need the tokenizer: loaded
            self.engine.on_deploy = self.http.warm  # while its weights load
        self.host: ServiceHost | None = None  # its token guards the HTTP endpoint too
        self._serving: asyncio.Task[None] | None = None  # serve_http's start of the endpoint
        self._ended = False

    # --- lifecycle -----------------------------------------------------------------------------

    async def open_http(self) -> None:
        """Bind the OpenAI endpoint before the router reports SERVING (the launcher's `prepare`
        step): a state file that names the endpoint is written only once it takes connections,
        which wait in its backlog until `serve_http` serves them."""
        if self.http is None or not self.http_address:
            return
        security = self.host.security if self.host is not None else OPEN
        security.check_bind("router (HTTP)", self.http_address)
        await self.http.bind(self.http_address, keys=security.keys)

    def serve_http(self) -> None:
        """Start serving the endpoint `open_http` bound, in the background: its launcher calls
        this once it is ready (runtime/registry.py), so that aiohttp's import (0.2 s of CPU)
        comes after `cmemu up`'s state file rather than before it."""
        if self.http is None or not self.http_address or self._ended or self._serving:
            return
        security = self.host.security if self.host is not None else OPEN
        start = self.http.start(
            self.http_address, keys=security.keys, ssl_context=security.ssl_context()
        )
        self._serving = asyncio.get_running_loop().create_task(start, name="router-http")
        self._serving.add_done_callback(_said)

    async def run(self) -> None:
        """Run the engine until close(); its streams end (their requests cancelled) before the
        endpoint stops."""
        try:
            await self.engine.run()
        finally:
            self._ended = True
            if self._serving is not None and not self._serving.done():
                self._serving.cancel()
                await asyncio.wait([self._serving])
            if self.http is not None:
                await self.http.stop()

    async def close(self) -> None:
        await self.engine.close()

    # --- reports -------------------------------------------------------------------------------

    def usage(self, tenant: str) -> router_pb2.UsageReport:
        """Each tenant's metered use (NotFoundError for a tenant the endpoint does not know)."""
        return usage_report(self.engine.usage.tenants(tenant), self.clock.now_ns())

    def metrics(self) -> list[Family]:
        """The tenants' figures and the serving figures for /metrics."""
        tenants = self.http.metrics() if self.http is not None else []
        return [*tenants, *self.engine.metrics()]


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.engine = state.engine

    @rpc
    async def Deploy(
        self, request: router_pb2.DeployRequest, context: Context
    ) -> router_pb2.Deployment:
        return deployment_message(await self.engine.deploy(deploy_ask(request)))

    @rpc
    async def Undeploy(
        self, request: router_pb2.UndeployRequest, context: Context
    ) -> router_pb2.Deployment:
        return deployment_message(await self.engine.undeploy(request.name))

    @rpc
    async def ListDeployments(
        self, request: router_pb2.ListDeploymentsRequest, context: Context
    ) -> router_pb2.DeploymentList:
        return router_pb2.DeploymentList(
            deployments=[deployment_message(d) for d in self.engine.deployments.values()]
        )

    @rpc
    async def GetDeployment(
        self, request: router_pb2.GetDeploymentRequest, context: Context
    ) -> router_pb2.Deployment:
        return deployment_message(self.engine.get(request.name))

    @rpc
    async def GetStats(
        self, request: router_pb2.GetStatsRequest, context: Context
    ) -> router_pb2.ServingStats:
        return stats_message(self.engine.stats(request.name))

    @rpc
    async def GetUsage(
        self, request: router_pb2.GetUsageRequest, context: Context
    ) -> router_pb2.UsageReport:
        return self.state.usage(request.tenant)


def create_router(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None = None,
) -> tuple[RouterState, ServiceHost]:
    service = topology.service(ServiceKind.ROUTER)
    state = RouterState(
        topology=topology,
        profile=profile,
        clock=clock,
        peers=peers,
        events=events,
        http_address=service.http_address,
    )
    peers.host_router(state.engine)  # the cluster manager of this process calls it directly
    servicer = RouterServicer(state)
    state.host = host = ServiceHost(
        name="router",
        address=address,
        services=[(SERVICE, lambda s: router_pb2_grpc.add_RouterServicer_to_server(servicer, s))],
    )
    return state, host


def _said(task: asyncio.Task[None]) -> None:
    """A start of the endpoint that failed is logged: nothing else awaits it."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the OpenAI endpoint did not start", error=repr(task.exception()))
