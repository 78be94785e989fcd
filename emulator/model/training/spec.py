"""A training job's shape, checked: how its dies split into data- and expert-parallel ranks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.models import ModelShape, get_model

NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,46}[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """What a caller asks the training service to run: the one spec the CLI, a day plan's night
    job and a chaos scenario's training workload all hand to `TrainingClient.start`. Zeros and
    an empty model take the service's defaults (`shape_of`)."""

    name: str
    npus: int
    model: str = ""
    steps: int = 0  # 0: until stopped
    checkpoint_every: int = 0
    data_parallel: int = 0
    expert_parallel: int = 0
    micro_batches: int = 0


@dataclass(frozen=True, kw_only=True)
class TrainingShape:
    """A job as the cost model sees it: `dies` ranks = `data_parallel` x `expert_parallel`."""

    name: str
    model: ModelShape
    npus: int
    steps: int  # 0: until stopped
    checkpoint_every: int
    data_parallel: int
    expert_parallel: int
    micro_batches: int

    @property
    def dies(self) -> int:
        return self.data_parallel * self.expert_parallel


def shape_of(
    *,
    name: str,
    npus: int,
    model: str = "",
    steps: int = 0,
    checkpoint_every: int = 0,
    data_parallel: int = 0,
    expert_parallel: int = 0,
    micro_batches: int = 0,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> TrainingShape:
    """Zeros take the defaults (every die a data-parallel rank, EP 1, one micro-batch, the
    profile's checkpoint interval); a layout that does not cover the dies exactly is refused."""
    if not NAME.match(name):
        raise InvalidArgumentError(
            f"training job name {name!r}: lower-case letters, digits, '.' and '-', at most 48",
            field="name",
        )
    if npus < 1:
        raise InvalidArgumentError("a training job needs at least 1 NPU", field="npus")
    dies = npus * profile.npu.dies
    ep = expert_parallel or 1
    dp = data_parallel or dies // ep
    if dp * ep != dies:
        raise InvalidArgumentError(
            f"data_parallel {dp} x expert_parallel {ep} must be the job's {dies} dies "
            f"({npus} NPUs of {profile.npu.dies})",
            field="data_parallel",
        )
    return TrainingShape(
        name=name,
        model=get_model(model or profile.training.default_model),
        npus=npus,
        steps=steps,
        checkpoint_every=checkpoint_every or profile.training.checkpoint_every,
        data_parallel=dp,
        expert_parallel=ep,
        micro_batches=micro_batches or 1,
    )
