"""The router service: deploys models on the live supernode and serves them.

gRPC (cmemu.v1.Router) deploys, lists and undeploys; the OpenAI-compatible HTTP endpoint
(services/serving/openai_http.py) at the service's `http_address` takes requests. Each deployment's
engine runs in a live driver (services/serving/driver.py), a task of this state's TaskGroup, and
a recovery watcher (services/serving/recovery.py) follows its scheduler allocations: a failed NPU
is isolated, its replacement restored.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.model.errors import (
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    quote,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.serving.cost import kv_bytes_per_token
from cmemu.emulator.model.serving.engine import Engine
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.pdpolicy import live_options, unit_rates
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.services.auth import OPEN
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, rpc
from cmemu.services.serving.deploy import LiveDeployment, Provisioner, parse_request, spec_text
from cmemu.services.serving.driver import Driver
from cmemu.services.serving.measures import ServingModel
from cmemu.services.serving.openai_http import OpenAiServer
from cmemu.services.serving.pdlive import LivePd
from cmemu.services.serving.recovery import Recovery
from cmemu.services.serving.reports import serving_families, usage_report
from cmemu.services.serving.stats import summarize
from cmemu.v1 import router_pb2, router_pb2_grpc

SERVICE = "cmemu.v1.Router"
log = structlog.get_logger("cmemu.router")


class RouterState:
    """The deployments and their drivers; `run` owns their tasks and the HTTP endpoint."""

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
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.events = events
        self.http_address = http_address
        self.ems_address = topology.service(ServiceKind.EMS).address
        self.provisioner = Provisioner(
            topology=topology,
            profile=profile,
            peers=peers,
            scheduler_address=topology.service(ServiceKind.SCHEDULER).address,
            ems_address=self.ems_address,
        )
        self.deployments: dict[str, LiveDeployment] = {}
        self.http = (
            OpenAiServer(router=self, profile=profile, clock=clock.clock) if http_address else None
        )
        self._tasks: asyncio.TaskGroup | None = None
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._recoveries: dict[str, asyncio.Task[None]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}  # live dynamic PD's deciding loops
        self._pds: dict[str, LivePd] = {}
        self._closed = asyncio.Event()
        self.host: ServiceHost | None = None  # its token guards the HTTP endpoint too

    def publish(self, event: str, **detail: object) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- lifecycle -----------------------------------------------------------------------------

    async def open_http(self) -> None:
        """Bind the OpenAI endpoint before the router reports SERVING (the launcher's `prepare`
        step): a state file that names the endpoint is written only once it answers."""
        if self.http is None or not self.http_address:
            return
        security = self.host.security if self.host is not None else OPEN
        security.check_bind("router (HTTP)", self.http_address)
        await self.http.start(
            self.http_address, keys=security.keys, ssl_context=security.ssl_context()
        )

    async def run(self) -> None:
        """Own the drivers until close(), then stop the endpoint open_http() started."""
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            try:
                await self._closed.wait()
            finally:  # streams end (their requests cancelled) before the endpoint stops
                self._tasks = None
                owned = [*self._loading.values(), *self._recoveries.values()]
                for task in [*owned, *self._watchers.values()]:
                    task.cancel()
                for live in self.deployments.values():
                    if live.driver is not None:
                        await live.driver.close()
                if self.http is not None:
                    await self.http.stop()

    async def close(self) -> None:
        self._closed.set()

    # --- deployments ---------------------------------------------------------------------------

    def get(self, name: str) -> LiveDeployment:
        live = self.deployments.get(name)
        if live is None:
            raise NotFoundError(
                f"no deployment {quote(name)}",
                field="name",
                subject=name,
                reason="DEPLOYMENT_NOT_FOUND",
            )
        return live

    async def deploy(self, request: router_pb2.DeployRequest) -> LiveDeployment:
        tasks = self._tasks
        if tasks is None:
            raise UnavailableError("the router is not running", retry_after_s=1.0)
        name, spec = parse_request(request, self.topology, self.profile)
        if self.http is not None:
            self.http.warm()  # its requests will need the tokenizer: loaded meanwhile
        if name in self.deployments:
            raise PreconditionError(
                f"deployment {name!r} exists (undeploy it first)",
                field="name",
                subject=name,
                reason="DEPLOYMENT_EXISTS",
            )
        live = LiveDeployment(
            name=name, spec=spec, spec_yaml=spec_text(spec), created_ns=self.clock.now_ns()
        )
        self.deployments[name] = live
        try:
            await self.provisioner.allocate(live)
            try:
                if request.warm:
                    await self.provisioner.stage_weights(live)
                await self.provisioner.plan_weights(live)
            except BaseException:
                await self.provisioner.release(live)
                raise
        except BaseException:
            self.deployments.pop(name, None)
            raise
        loading = tasks.create_task(self._load(live), name=f"load-{name}")
        self._loading[name] = loading
        loading.add_done_callback(lambda _: self._loading.pop(name, None))
        self.publish("deploying", deployment=name, npus=live.message().npus)
        if request.wait:
            await asyncio.shield(loading)
            if live.state == router_pb2.DEPLOYMENT_STATE_FAILED:
                raise UnavailableError(f"deployment {name!r} failed: {live.error}", subject=name)
        return live

    async def _load(self, live: LiveDeployment) -> None:
        """Weights through EMS, the emulated loading time, then the engine and its driver."""
        try:
            load_s = await self.provisioner.load_weights(live)
            started = self.clock.now_ns()
            await self.clock.sleep(load_s)
            live.loaded_ns = started + round(load_s * 1e9)
            model = get_model(live.spec.model)
            s = self.profile.serving
            driver = Driver(
                name=live.name,
                engine=Engine(live.spec, profile=self.profile),
                instances=live.instances,
                model=ServingModel(
                    block_tokens=s.block_tokens,
                    kv_bytes_per_token=round(kv_bytes_per_token(model, self.profile)),
                    lookup_s=s.ems_lookup_s,
                ),
                clock=self.clock,
                peers=self.peers,
                ems_address=self.ems_address,
                events=self.events,
                profile=self.profile,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            live.state = router_pb2.DEPLOYMENT_STATE_FAILED
            live.error = str(exc)
            log.warning("deployment failed", deployment=live.name, error=str(exc))
            self.publish("deployment-failed", deployment=live.name, error=str(exc))
            with contextlib.suppress(EmulatorError):
                await self.provisioner.release(live)
            return
        live.driver = driver
        live.state = router_pb2.DEPLOYMENT_STATE_SERVING
        self.publish("deployed", deployment=live.name, weights=live.weights_source)
        tasks = self._tasks
        if tasks is not None:
            tasks.create_task(driver.run(), name=f"driver-{live.name}")
            recovery = Recovery(
                live=live,
                driver=driver,
                provisioner=self.provisioner,
                topology=self.topology,
                profile=self.profile,
                clock=self.clock,
                peers=self.peers,
            )
            watching = tasks.create_task(recovery.run(), name=f"recovery-{live.name}")
            self._recoveries[live.name] = watching
            watching.add_done_callback(lambda _: self._recoveries.pop(live.name, None))
            self._start_pd(live, driver, tasks)

    def _start_pd(self, live: LiveDeployment, driver: Driver, tasks: asyncio.TaskGroup) -> None:
        """Live dynamic PD (services/serving/pdlive.py), when the deployment asks for it."""
        options = live_options(live.spec)
        if options is None:
            return
        pd = LivePd(
            live=live,
            driver=driver,
            provisioner=self.provisioner,
            options=options,
            rates=unit_rates(live.spec, profile=self.profile),
            clock=self.clock,
            profile=self.profile,
            ems_address=self.ems_address,
        )
        live.pd = pd.status
        self._pds[live.name] = pd
        deciding = tasks.create_task(pd.run(), name=f"pd-{live.name}")
        self._watchers[live.name] = deciding
        deciding.add_done_callback(lambda _: self._watchers.pop(live.name, None))

    async def undeploy(self, name: str) -> LiveDeployment:
        live = self.get(name)
        loading = self._loading.get(name)
        if loading is not None:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
        for task in (self._recoveries.get(name), self._watchers.get(name)):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._pds.pop(name, None)
        if live.driver is not None:
            await live.driver.close()
        await self.provisioner.release(live)
        live.state = router_pb2.DEPLOYMENT_STATE_STOPPED
        self.deployments.pop(name, None)
        self.publish("undeployed", deployment=name)
        return live

    def serving(self, model: str) -> Driver:
        """The driver that serves `model` (a deployment name): NotFoundError when there is no
        such deployment, UnavailableError while it is loading or failed."""
        live = self.get(model)
        if live.driver is None or live.state != router_pb2.DEPLOYMENT_STATE_SERVING:
            state = router_pb2.DeploymentState.Name(live.state).removeprefix("DEPLOYMENT_STATE_")
            raise UnavailableError(
                f"deployment {model!r} is {state.lower()}", subject=model, retry_after_s=1.0
            )
        return live.driver

    def stats(self, name: str) -> router_pb2.ServingStats:
        lives = [self.get(name)] if name else list(self.deployments.values())
        return summarize([live.driver.stats for live in lives if live.driver is not None])

    def usage(self, tenant: str) -> router_pb2.UsageReport:
        """Each tenant's metered use (NotFoundError for a tenant the endpoint does not know)."""
        meter = self.http.admission.meter if self.http is not None else None
        return usage_report(meter, self.clock.now_ns(), tenant)

    def metrics(self) -> list[Family]:
        """Serving figures for /metrics, per deployment (emulated seconds, tokens)."""
        drivers = {n: live.driver for n, live in self.deployments.items() if live.driver}
        tenants = self.http.metrics() if self.http is not None else []
        units = {name: pd.units() for name, pd in self._pds.items()}
        return [*tenants, *serving_families(drivers, units)]


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, state: RouterState) -> None:
        self.state = state

    @rpc
    async def Deploy(
        self, request: router_pb2.DeployRequest, context: Context
    ) -> router_pb2.Deployment:
        return (await self.state.deploy(request)).message()

    @rpc
    async def Undeploy(
        self, request: router_pb2.UndeployRequest, context: Context
    ) -> router_pb2.Deployment:
        return (await self.state.undeploy(request.name)).message()

    @rpc
    async def ListDeployments(
        self, request: router_pb2.ListDeploymentsRequest, context: Context
    ) -> router_pb2.DeploymentList:
        return router_pb2.DeploymentList(
            deployments=[d.message() for d in self.state.deployments.values()]
        )

    @rpc
    async def GetDeployment(
        self, request: router_pb2.GetDeploymentRequest, context: Context
    ) -> router_pb2.Deployment:
        return self.state.get(request.name).message()

    @rpc
    async def GetStats(
        self, request: router_pb2.GetStatsRequest, context: Context
    ) -> router_pb2.ServingStats:
        return self.state.stats(request.name)

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
    servicer = RouterServicer(state)
    state.host = host = ServiceHost(
        name="router",
        address=address,
        services=[(SERVICE, lambda s: router_pb2_grpc.add_RouterServicer_to_server(servicer, s))],
    )
    return state, host
