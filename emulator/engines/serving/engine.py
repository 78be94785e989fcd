"""The router's serving domain: the deployments of the live supernode and their tasks.

Each deployment's engine runs in a live driver (driver.py), a task of this engine's TaskGroup,
beside a recovery watcher (recovery.py) that follows its scheduler allocations (a failed NPU is
isolated, its replacement restored) and, when the deployment asks for it, live dynamic PD
(pdlive.py). The scheduler, EMS, the NPUs, the fabric and the RDMA plane's gateway are reached
through their peers (engines/peers.py, peers.py); cmemu.v1.Router and the OpenAI endpoint
(services/router.py, services/serving/) only translate to and from this.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.outage import Outage
from cmemu.emulator.engines.peers import JobScheduler
from cmemu.emulator.engines.serving.peers import KvStore, ServingDirectory
from cmemu.emulator.engines.serving.spec import DeployAsk, parse_ask, spec_text
from cmemu.emulator.engines.serving.usage import UsageMeter
from cmemu.emulator.model.errors import (
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
    quote,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.serving.live import DeploymentState, ServingStats
from cmemu.emulator.model.topology import Topology

if TYPE_CHECKING:
    # the deployments' machinery (their drivers, the serving model, its cost models: 30 ms of
    # imports) comes with the first deployment, not at every boot that makes the router
    from cmemu.emulator.engines.serving.deploy import LiveDeployment, Provisioner
    from cmemu.emulator.engines.serving.driver import Driver
    from cmemu.emulator.engines.serving.pdlive import LivePd

log = structlog.get_logger("cmemu.router")
REASON_DOWN = "ROUTER_DOWN"  # a killed router, as its callers in this process meet it


class ServingEngine:
    """The deployments and their drivers; `run` owns their tasks until `close`."""

    name = "router"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: ServingDirectory,
        scheduler: JobScheduler,
        ems: KvStore,
        events: EventSink | None,
        on_deploy: Callable[[], None] | None = None,
    ) -> None:
        """`on_deploy`: called when a deployment's request has parsed (the HTTP endpoint loads
        its tokenizer meanwhile: its requests will need it)."""
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.ems = ems
        self.events = events
        self.on_deploy = on_deploy
        self.scheduler = scheduler
        self._provisioner: Provisioner | None = None  # made with the first deployment
        self.deployments: dict[str, LiveDeployment] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._recoveries: dict[str, asyncio.Task[None]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}  # live dynamic PD's deciding loops
        self._pds: dict[str, LivePd] = {}
        self._closed = asyncio.Event()
        # its service down, as the manager and the day plans of this process meet it
        self.outage = Outage("router", REASON_DOWN)  # (engines/outage.py)
        self.usage = UsageMeter()  # the OpenAI endpoint charges it, GetUsage reads it

    @property
    def provisioner(self) -> Provisioner:
        """What allocates a deployment's NPUs and loads its weights (deploy.py)."""
        if self._provisioner is None:
            from cmemu.emulator.engines.serving.deploy import Provisioner

            self._provisioner = Provisioner(
                topology=self.topology, profile=self.profile, clock=self.clock, peers=self.peers,
                scheduler=self.scheduler, ems=self.ems,
            )  # fmt: skip
        return self._provisioner

    def publish(self, event: str, **detail: object) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the drivers until close(); their requests end (cancelled) before this returns."""
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            try:
                await self._closed.wait()
            finally:
                self._tasks = None
                owned = [*self._loading.values(), *self._recoveries.values()]
                for task in [*owned, *self._watchers.values()]:
                    task.cancel()
                for live in self.deployments.values():
                    if live.driver is not None:
                        await live.driver.close()

    async def close(self) -> None:
        self._closed.set()

    @property
    def running(self) -> bool:
        """`run` owns the deployments' tasks (a deploy before it, or after `close`, is
        UNAVAILABLE)."""
        return self._tasks is not None

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

    async def deploy(self, ask: DeployAsk) -> LiveDeployment:
        tasks = self._tasks
        if tasks is None:
            raise UnavailableError("the router is not running", retry_after_s=1.0)
        from cmemu.emulator.engines.serving.deploy import LiveDeployment

        name, spec = parse_ask(ask, self.topology, self.profile)
        if self.on_deploy is not None:
            self.on_deploy()
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
                if ask.warm:
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
        self.publish("deploying", deployment=name, npus=live.npus)
        if ask.wait:
            await asyncio.shield(loading)
            if live.state is DeploymentState.FAILED:
                raise UnavailableError(f"deployment {name!r} failed: {live.error}", subject=name)
        return live

    async def _load(self, live: LiveDeployment) -> None:
        """Weights through EMS, the emulated loading time, then the engine and its driver."""
        from cmemu.emulator.engines.serving.driver import Driver
        from cmemu.emulator.engines.serving.measures import ServingModel
        from cmemu.emulator.engines.serving.recovery import Recovery
        from cmemu.emulator.model.serving.cost import kv_bytes_per_token
        from cmemu.emulator.model.serving.engine import Engine
        from cmemu.emulator.model.serving.models import get_model

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
                ems=self.ems,
                events=self.events,
                profile=self.profile,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            live.state = DeploymentState.FAILED
            live.error = str(exc)
            log.warning("deployment failed", deployment=live.name, error=str(exc))
            self.publish("deployment-failed", deployment=live.name, error=str(exc))
            with contextlib.suppress(EmulatorError):
                await self.provisioner.release(live)
            return
        live.driver = driver
        live.state = DeploymentState.SERVING
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
        """Live dynamic PD (pdlive.py), when the deployment asks for it."""
        from cmemu.emulator.engines.serving.pdlive import LivePd
        from cmemu.emulator.model.serving.pdpolicy import live_options, unit_rates

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
        live.state = DeploymentState.STOPPED
        self.deployments.pop(name, None)
        self.publish("undeployed", deployment=name)
        return live

    def serving(self, model: str) -> Driver:
        """The driver that serves `model` (a deployment name): NotFoundError when there is no
        such deployment, UnavailableError while it is loading or failed."""
        live = self.get(model)
        if live.driver is None or live.state is not DeploymentState.SERVING:
            raise UnavailableError(
                f"deployment {model!r} is {live.state.value}", subject=model, retry_after_s=1.0
            )
        return live.driver

    def stats(self, name: str) -> ServingStats:
        """One deployment's serving aggregates ("": every deployment's)."""
        from cmemu.emulator.engines.serving.stats import summarize

        lives = [self.get(name)] if name else list(self.deployments.values())
        return summarize([live.driver.stats for live in lives if live.driver is not None])

    def metrics(self) -> list[Family]:
        """Serving figures for /metrics, per deployment (emulated seconds, tokens)."""
        from cmemu.emulator.engines.serving.reports import serving_families

        drivers = {n: live.driver for n, live in self.deployments.items() if live.driver}
        units = {name: pd.units() for name, pd in self._pds.items()}
        return serving_families(drivers, units)
