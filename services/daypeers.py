"""The scheduler's day plans' peers, resolved at each call: the router (DayServing) and the
training jobs (DayTraining) of engines/dayplan.py, as `Peers` finds them when the call is made.

The runtime makes the scheduler before the router and the cluster manager (its waves), so the
scheduler cannot be handed their engines when it is made; a day plan starts only once the
supernode runs, when `Peers` knows whether this process hosts them (services/peers.py
`day_serving_now`, `day_training_now`: the engine, or the typed gRPC client)."""

from __future__ import annotations

from collections.abc import Callable

from cmemu.emulator.engines.dayplan import DayServing, DayTraining
from cmemu.emulator.model.training.spec import TrainingSpec


class DayServingOf:
    def __init__(self, resolve: Callable[[], DayServing]) -> None:
        self.resolve = resolve

    async def spec(self, deployment: str) -> tuple[str, int]:
        return await self.resolve().spec(deployment)

    async def deploy(self, deployment: str, spec_yaml: str) -> int:
        return await self.resolve().deploy(deployment, spec_yaml)

    async def undeploy(self, deployment: str) -> None:
        await self.resolve().undeploy(deployment)

    async def in_flight(self, deployment: str) -> int:
        return await self.resolve().in_flight(deployment)

    async def served_tokens(self) -> int:
        return await self.resolve().served_tokens()


class DayTrainingOf:
    def __init__(self, resolve: Callable[[], DayTraining]) -> None:
        self.resolve = resolve

    async def start(self, job: TrainingSpec, *, resume: bool) -> int:
        return await self.resolve().start(job, resume=resume)

    async def stop(self, job: str, *, checkpoint: bool) -> None:
        await self.resolve().stop(job, checkpoint=checkpoint)

    async def progress(self, job: str) -> tuple[str, int]:
        return await self.resolve().progress(job)
