"""Dies taken out of an instance and brought back (issue 11): the engine's side of a lost NPU
(emulator/model/serving/engine.py, "Failures", says what happens to the requests)."""

from __future__ import annotations

from collections.abc import Collection

from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
)
from cmemu.emulator.model.serving.engine_state import EngineState
from cmemu.emulator.model.serving.instances import (
    DecodeInstance,
    PrefillInstance,
    Stage,
)
from cmemu.emulator.model.serving.placement import Remap
from cmemu.emulator.model.serving.prefix import PrefixCache


class Faults(EngineState):
    """Isolating and restoring dies; what is isolated now."""

    def isolate(self, instance: str, dies: Collection[int], now_s: float) -> tuple[int, ...]:
        """Take `dies` (indexes in the instance's layout order) out of `instance` at `now_s`;
        the plans abandoned (a later report or fail of them is ignored)."""
        lost = self._dies(instance, dies)
        dec = self._decodes.get(instance)
        if dec is not None:
            return self._isolate_decode(dec, lost, now_s)
        return self._isolate_prefill(self._prefills[instance], lost, now_s)

    def _isolate_decode(self, dec: DecodeInstance, lost: set[int], now_s: float) -> tuple[int, ...]:
        instance = dec.name
        abandoned: list[int] = []
        fresh = lost - dec.lost
        if fresh:
            if dec.busy is not None:
                abandoned.append(self._abandon(dec.busy))
                dec.busy = None
            held = dec.lose(fresh)
            for step in list(self._steps.values()):  # transfers into a lost slot start over
                t = step.plan.transfer
                if t is not None and t.dst == instance and not step.abandoned:
                    req = self._reqs.get(step.plan.requests[0])
                    if req is not None and req.slot % dec.dies in fresh:
                        abandoned.append(self._abandon(step.plan.id))
                        held.remove(req.slot)
                        dec.release(req.slot)
                        req.stage, req.decode, req.slot = Stage.WAITING, "", -1
                        self._waiting.appendleft(req.request.id)
            for slot in held:
                rid = dec.ids[slot]
                req = self._reqs[rid]
                req.resume = int(dec.emitted[slot])
                if slot in dec.joining:
                    dec.joining.remove(slot)
                dec.release(slot)
                req.stage, req.decode, req.slot = Stage.NEW, "", -1
                if self._retry(req, now_s, f"its KV cache was on a lost die of {instance}"):
                    self._new.append(rid)
            self._dirty_decode.add(instance)
            self._slots_dirty = True
        return tuple(abandoned)

    def _isolate_prefill(
        self, pre: PrefillInstance, lost: set[int], now_s: float
    ) -> tuple[int, ...]:
        instance = pre.name
        abandoned: list[int] = []
        fresh = lost - pre.lost
        if not fresh:
            return ()
        pre.lost |= fresh
        pre.cache = PrefixCache(self._prefix_blocks)  # its HBM's prompt blocks are gone
        if pre.busy is not None:
            step = self._steps[pre.busy]
            abandoned.append(self._abandon(pre.busy))
            pre.busy, pre.busy_tokens = None, 0
            for rid in step.plan.requests:
                req = self._reqs.get(rid)
                if req is not None and self._retry(req, now_s, f"{instance} lost a die"):
                    self._enqueue(req, now_s)
        for step in list(self._steps.values()):  # KV caches still on the instance are gone
            t = step.plan.transfer
            if t is not None and t.src == instance and not step.abandoned:
                abandoned.append(self._abandon(step.plan.id))
                req = self._reqs.get(step.plan.requests[0])
                if req is not None:
                    dec = self._decodes[req.decode]
                    dec.release(req.slot)
                    self._slots_dirty = True
                    self._prefill_again(req, now_s, f"its KV cache was on {instance}")
        for rid in [r for r in self._waiting if self._reqs[r].prefill == instance]:
            self._waiting.remove(rid)
            self._prefill_again(self._reqs[rid], now_s, f"its KV cache was on {instance}")
        queued = [self._reqs[rid] for rid in pre.queue]
        pre.queue.clear()
        pre.queued_tokens = 0
        for req in queued:
            self._enqueue(req, now_s)
        return tuple(abandoned)

    def restore(self, instance: str, dies: Collection[int], now_s: float) -> None:
        """Bring isolated dies of `instance` back (replaced, their weights loaded)."""
        back = self._dies(instance, dies)
        dec = self._decodes.get(instance)
        if dec is not None:
            dec.regain(back)
            self._dirty_decode.add(instance)
            self._slots_dirty = True
            return
        pre = self._prefills[instance]
        pre.lost -= back
        self._dirty_prefill.add(instance)

    def _dies(self, instance: str, dies: Collection[int]) -> set[int]:
        dec = self._decodes.get(instance)
        if dec is None and instance not in self._prefills:
            known = [*self._decodes, *self._prefills]
            raise NotFoundError(
                f"no instance {instance!r}; known: {', '.join(known)}",
                field="instance",
                subject=instance,
            )
        count = dec.dies if dec is not None else self._prefill_dies
        bad = [d for d in dies if not 0 <= d < count]
        if bad:
            raise InvalidArgumentError(
                f"{instance} has dies 0..{count - 1}, not {bad[0]}", field="dies", subject=instance
            )
        return set(dies)

    def isolated(self) -> dict[str, tuple[int, ...]]:
        """Each instance's isolated dies (instances without any left out)."""
        out = {n: tuple(sorted(d.lost)) for n, d in self._decodes.items() if d.lost}
        out.update({n: tuple(sorted(p.lost)) for n, p in self._prefills.items() if p.lost})
        return out

    def remapped(self, instance: str) -> Remap | None:
        """A decode instance's expert placement after its lost dies (None: as deployed)."""
        dec = self._decodes.get(instance)
        return None if dec is None else dec.remap

    def imbalance(self, instance: str) -> float:
        """The imbalance a decode instance's steps are costed at now."""
        return self._decodes[instance].imbalance
