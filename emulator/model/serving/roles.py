"""An instance changing role (issue 24 item 4, live dynamic PD): the engine's side of moving a
unit between prefill and decode. The policy that decides is pdpolicy.py's; the caller (the live
router's emulator/engines/serving/pdlive.py) asks for the move, waits for the instance to drain,
reloads its weights and brings it back in its new role.

A unit is one instance: with `decode.npus == prefill.npus` a prefill instance and a decode
instance are the same NPUs, so an instance keeps its name (and its NPUs) through a change and
comes back exactly as an instance of its new role is built at the start.

- `retire(role, count)`: that many instances of `role` stop taking new work (idle ones first,
  then the least loaded). A prefill instance's queue moves to the instances staying; the batch in
  flight finishes, and the KV caches it holds go to decode as usual. A decode instance takes no
  new request and finishes those it holds (its slots empty as they end).
- `drained(name)`: nothing left on it: it may `leave` the engine (no role while it reloads).
- `join(name, role)`: back in service in its new role.
"""

from __future__ import annotations

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.model.serving.engine_state import EngineState
from cmemu.emulator.model.serving.instances import DecodeInstance, PrefillInstance, Stage
from cmemu.emulator.model.serving.plans import Request
from cmemu.emulator.model.serving.prefix import PrefixCache

ROLES = ("prefill", "decode")


class Roles(EngineState):
    """Instances moved between the roles (module docstring)."""

    def roles(self) -> dict[str, str]:
        """Each instance in service (retiring ones too) and its role, prefill first."""
        return {n: "prefill" for n in self._prefills} | {n: "decode" for n in self._decodes}

    def retiring(self) -> list[str]:
        out = [n for n, p in self._prefills.items() if p.retiring]
        return out + [n for n, d in self._decodes.items() if d.retiring]

    def backlog(self) -> tuple[list[Request], list[Request]]:
        """The requests waiting for prefill (new, looking up, queued) and those prefilled and
        waiting for a decode slot: the work a split has yet to carry."""
        early = (Stage.NEW, Stage.LOOKUP, Stage.QUEUED)
        queued = [t.request for t in self._reqs.values() if t.stage in early]
        return queued, [self._reqs[rid].request for rid in self._waiting]

    def retire(self, role: str, count: int, now_s: float) -> list[str]:
        """`count` instances of `role` stop taking new work now; their names. At least one
        instance of each role keeps taking work (PreconditionError otherwise)."""
        if role not in ROLES:
            raise InvalidArgumentError(
                f"role must be prefill or decode, got {role!r}", field="role"
            )
        if role == "prefill":
            staying_p = [p for p in self._prefills.values() if p.taking]
            if count >= len(staying_p):
                raise PreconditionError(
                    f"{count} of {len(staying_p)} prefill instances cannot retire: one must stay"
                )
            order = sorted(staying_p, key=lambda p: (p.busy is not None, p.queued_tokens, p.name))
            chosen_p = order[:count]
            for inst in chosen_p:
                inst.retiring = True
            for inst in chosen_p:  # what waits there goes to the instances staying
                queued = [self._reqs[rid] for rid in inst.queue]
                inst.queue.clear()
                inst.queued_tokens = 0
                for req in queued:
                    self._enqueue(req, now_s)
            return [p.name for p in chosen_p]
        staying = [d for d in self._decodes.values() if not d.retiring and d.capacity > 0]
        if count >= len(staying):
            raise PreconditionError(
                f"{count} of {len(staying)} decode instances cannot retire: one must stay"
            )
        chosen = sorted(staying, key=lambda d: (d.reserved, d.name))[:count]
        for dec in chosen:
            dec.retiring = True
        return [d.name for d in chosen]

    def drained(self, name: str) -> bool:
        """Whether a retiring instance holds nothing any more (its last step ended, no KV cache
        of a request on it)."""
        pre = self._prefills.get(name)
        if pre is not None:
            if pre.busy is not None or pre.queue:
                return False
            holding = (Stage.WAITING, Stage.TRANSFER)  # their KV cache is still in its HBM
            return not any(r.prefill == name and r.stage in holding for r in self._reqs.values())
        dec = self._decode(name)
        return dec.busy is None and dec.reserved == 0

    def leave(self, name: str) -> str:
        """A drained instance leaves its role (it reloads its weights, in no role); the role."""
        if not self.drained(name):
            raise PreconditionError(f"{name} still holds work", subject=name)
        self._dirty_prefill.discard(name)
        self._dirty_decode.discard(name)
        if self._prefills.pop(name, None) is not None:
            return "prefill"
        del self._decodes[name]
        return "decode"

    def join(self, name: str, role: str) -> None:
        """Bring `name` back in `role`, built as an instance of that role is at the start."""
        if name in self._prefills or name in self._decodes:
            raise PreconditionError(f"{name} is in service already", subject=name)
        if role == "prefill":
            self._prefills[name] = PrefillInstance(name, PrefixCache(self._prefix_blocks))
            self._dirty_prefill.add(name)
        elif role == "decode":
            self._decodes[name] = DecodeInstance(
                name,
                self._decode_dies,
                self.deployment.decode.max_batch_per_die,
                self._decode_experts,
                self._decode_imbalance,
                kv_budget=self._kv_budget,
            )
            self._slots_dirty = True  # prefilled requests waiting for a slot may go there
        else:
            raise InvalidArgumentError(
                f"role must be prefill or decode, got {role!r}", field="role"
            )

    def _decode(self, name: str) -> DecodeInstance:
        dec = self._decodes.get(name)
        if dec is None:
            known = [*self._prefills, *self._decodes]
            raise NotFoundError(
                f"no instance {name!r} in service; known: {', '.join(known)}", subject=name
            )
        return dec
