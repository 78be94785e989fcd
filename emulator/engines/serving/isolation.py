"""A deployment's NPUs out of service and back: isolation, restoration, and the health they make.

The recovery watcher (engines/serving/recovery.py) decides which NPU to take out and when its
replacement is ready; this is the driver's side of it: the NPU's in-flight measurements fail at
once (a hung die never answers), and its dies leave (or rejoin) their instance as inputs to the
engine at an emulated instant, like any submit, so the live run stays the simulation's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.serving.measures import LiveInstance
from cmemu.emulator.model.serving.deployment import instance_dies
from cmemu.emulator.model.topology import Device

if TYPE_CHECKING:
    from cmemu.emulator.engines.serving.driver import Driver


@dataclass(frozen=True, kw_only=True)
class Health:
    """What GetDeployment reports of the deployment's faults."""

    failed_dies: tuple[str, ...]
    last_isolated_ns: int
    last_restored_ns: int
    health: str  # "serving" | "degraded" | "recovering"


class Isolation:
    """Which of a driver's NPUs are isolated (and which are being brought back)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.isolated: dict[str, tuple[str, tuple[int, ...]]] = {}  # npu: (instance, die indexes)
        self.recovering: set[str] = set()  # npus whose replacement is loading
        self.last_isolated_ns = 0
        self.last_restored_ns = 0

    def locate(self, npu: str) -> tuple[str, int] | None:
        """The instance holding `npu` and its index among the instance's NPUs."""
        for inst in self.driver.instances.values():
            for k, device in enumerate(inst.npus):
                if device.id == npu:
                    return inst.id, k
        return None

    def isolate(self, npus: Sequence[str], cause: str, job: Callable[[str], str]) -> list[str]:
        """Take `npus` (those of this deployment not isolated yet) out of their instances now:
        the engine drops their dies at the present emulated instant. The NPUs taken."""
        per = self.driver.profile.npu.dies
        taken: list[str] = []
        for npu in npus:
            where = self.locate(npu)
            if where is None or npu in self.isolated:
                continue
            instance, k = where
            dies = tuple(range(k * per, (k + 1) * per))
            self.isolated[npu] = (instance, dies)
            taken.append(npu)
            self.driver.preempt(instance, f"{npu} was isolated ({cause})")

            def apply(
                t: float, npu: str = npu, instance: str = instance, d: tuple[int, ...] = dies
            ) -> None:
                self.driver.engine.isolate(instance, d, t)
                t_ns = round(t * 1e9)
                self.last_isolated_ns = t_ns
                self.driver.publish(
                    "isolated",
                    t_ns,
                    instance=instance,
                    job=job(instance),
                    npus=[npu],
                    dies=[self.driver.instances[instance].dies[i] for i in d],
                    cause=cause,
                )

            self.driver.at(self.driver.now_s(), apply)
        return taken

    def restore(
        self, old: str, new: Device, kv_offset: int | None, at_s: float, job: Callable[[str], str]
    ) -> None:
        """Bring isolated NPU `old` back as `new` (itself or its replacement, its weights
        loaded) at emulated `at_s` (no earlier than inputs already queued)."""
        found = self.isolated.get(old)
        if found is None:
            return
        instance, dies = found

        def apply(t: float) -> None:
            inst = self.driver.instances[instance]
            ids = [d.id for d in inst.npus]
            if old not in ids:  # restored already
                return
            k = ids.index(old)
            npus = list(inst.npus)
            npus[k] = new
            offsets = list(inst.kv_offsets)
            if offsets and kv_offset is not None:
                offsets[k] = kv_offset
            per = self.driver.profile.npu.dies
            names = list(inst.dies)
            names[k * per : (k + 1) * per] = instance_dies([new.id], self.driver.profile)
            self.driver.instances[instance] = LiveInstance(
                id=instance, npus=tuple(npus), dies=tuple(names), kv_offsets=tuple(offsets)
            )
            self.driver.engine.restore(instance, dies, t)
            self.isolated.pop(old, None)
            self.recovering.discard(old)
            t_ns = round(t * 1e9)
            self.last_restored_ns = t_ns
            self.driver.publish(
                "restored",
                t_ns,
                instance=instance,
                job=job(instance),
                npus=[new.id],
                replaced=old if old != new.id else "",
            )

        self.driver.at(at_s, apply)

    def health(self) -> Health:
        out = self.driver.engine.isolated()  # what is applied, not what is queued
        failed = [self.driver.instances[inst].dies[i] for inst, dies in out.items() for i in dies]
        state = "serving"
        if out and self.recovering:
            state = "recovering"
        elif out or not self.driver.engine.accepting():
            state = "degraded"
        return Health(
            failed_dies=tuple(sorted(failed)),
            last_isolated_ns=self.last_isolated_ns,
            last_restored_ns=self.last_restored_ns,
            health=state,
        )
