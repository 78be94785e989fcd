"""Who is asking and whether they may, now: the tenant behind an API key, its rate limits and
quota (emulator/model/tenants.py does the arithmetic on the emulated clock), its priority class,
and what it used (metered when each response's `usage` is final, so the per-tenant totals are the
sum of the responses' `usage`).

Priority classes share a deployment's decode slots: online requests go straight in; near-line
ones wait while the deployment holds `near_line_share` of its slots or more; offline ones wait
while it holds `offline_share` or more, or while anything of a higher class waits. An arrival
that does not fit beside what runs preempts work of a lower class (offline first, the newest
first): that request's engine request is cancelled, its KV freed, and it waits for its turn
again, then continues where it stopped (its prompt and the tokens it had, recomputed; its client
sees a pause, never a lost token). So offline work fills idle capacity and is preempted first
(the shares are figures of the hardware profile's serving section, `tenant_*_share`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.tenants import (
    DEFAULT_TENANT,
    Keys,
    Meter,
    Priority,
    QuotaExceededError,
    RateLimitedError,
    Tenant,
)
from cmemu.services.serving.endpoint.errors import HttpError, from_domain

if TYPE_CHECKING:  # a deployment's driver: imported with the first deployment (engine.py)
    from cmemu.emulator.engines.serving.driver import Driver

POLL_WALL_S = 0.05  # a waiting request looks again this often (and whenever a request ends)
OPEN_TENANT = Tenant(name=DEFAULT_TENANT, key="")


@dataclass(eq=False, kw_only=True)
class Ticket:
    """Slots a request holds; `preempt` (set by a preemptible request) takes them back."""

    deployment: str
    priority: Priority
    answers: int
    preempt: Callable[[], None] | None = None
    held: bool = True


@dataclass
class _Turns:
    """One deployment's requests in flight and waiting, per class."""

    running: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    waiting: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    tickets: list[Ticket] = field(default_factory=list)  # in the order they were taken


class Admission:
    def __init__(
        self,
        *,
        meter: Meter,
        keys: Keys | None,
        clock: Clock,
        near_line_share: float,
        offline_share: float,
    ) -> None:
        """`meter`: the router's (engines/serving/usage.py), for `keys`' tenants (or
        OPEN_TENANT alone without keys)."""
        self.keys = keys
        self.clock = clock
        self.shares = {
            Priority.ONLINE: 1.0,
            Priority.NEAR_LINE: near_line_share,
            Priority.OFFLINE: offline_share,
        }
        self.meter = meter
        self._turns: dict[str, _Turns] = {}
        self._changed = asyncio.Event()
        self.preempted = 0  # requests preempted to make room for a higher class

    # --- who ---------------------------------------------------------------------------------

    def tenant(self, authorization: str) -> Tenant:
        """The tenant of an `Authorization: Bearer <key>` header: 401 when keys are configured
        and it names none of them; everyone is `default` when none are."""
        if self.keys is None:
            return OPEN_TENANT
        scheme, _, key = authorization.strip().partition(" ")
        tenant = self.keys.tenant(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise HttpError(
                401,
                "this endpoint needs an API key: a tenant's key from the keys file, or the "
                "emulator's token (Authorization: Bearer <key>)",
                code="invalid_api_key",
            )
        return tenant

    # --- may they ----------------------------------------------------------------------------

    def admit(self, tenant: Tenant, prompt_tokens: int) -> None:
        """Take the request against the tenant's limits: 429 (Retry-After in wall seconds)."""
        try:
            self.meter.admit(tenant, prompt_tokens, self.clock.now_ns() / 1e9)
        except (QuotaExceededError, RateLimitedError) as exc:
            wall = None
            if exc.retry_after_s is not None:
                wall = self.clock.wall_delay_s(exc.retry_after_s)
            raise from_domain(exc, wall) from exc

    async def acquire(self, tenant: Tenant, driver: Driver, answers: int) -> Ticket:
        """Hold `answers` of the deployment's decode slots once the tenant's class may run
        (online: at once). An arrival that does not fit beside what runs makes room by
        preempting work of a lower class, newest first (offline before near-line)."""
        turns = self._turns.setdefault(driver.name, _Turns())
        cls = tenant.priority
        turns.waiting[cls] += 1
        try:
            while not self._may_run(turns, cls, driver, answers):
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_WALL_S):
                        await self._changed.wait()
        finally:
            turns.waiting[cls] -= 1
        self._make_room(turns, cls, driver.stats.kv_slots, answers)
        ticket = Ticket(deployment=driver.name, priority=cls, answers=answers)
        turns.running[cls] += answers
        turns.tickets.append(ticket)
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the slots back (once: a preempted ticket was given back already)."""
        if not ticket.held:
            return
        ticket.held = False
        turns = self._turns[ticket.deployment]
        turns.running[ticket.priority] -= ticket.answers
        turns.tickets.remove(ticket)
        self._changed.set()

    def _make_room(self, turns: _Turns, cls: Priority, slots: int, answers: int) -> None:
        over = sum(turns.running.values()) + answers - slots
        if slots <= 0 or over <= 0:
            return
        victims = sorted(
            (t for t in turns.tickets if t.priority.rank > cls.rank and t.preempt is not None),
            key=lambda t: -t.priority.rank,  # offline first; newest first within a class
        )
        for victim in victims:
            if over <= 0:
                return
            preempt = victim.preempt
            assert preempt is not None
            preempt()
            over -= victim.answers
            self.preempted += 1
            self.release(victim)

    def _may_run(self, turns: _Turns, cls: Priority, driver: Driver, answers: int) -> bool:
        if cls is Priority.ONLINE:
            return True
        if any(turns.waiting[p] for p in Priority if p.rank < cls.rank):
            return False
        slots = driver.stats.kv_slots
        if slots <= 0:  # not measured yet: one at a time
            return sum(turns.running.values()) == 0
        held = sum(turns.running.values())
        return held + answers <= max(1.0, self.shares[cls] * slots)

    # --- what they used ----------------------------------------------------------------------

    def charge(self, tenant: Tenant, admitted: int, usage: dict[str, object]) -> None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
        self.meter.charge(
            tenant.name,
            admitted_prompt=admitted,
            prompt_tokens=int(str(usage["prompt_tokens"])),
            cached_tokens=int(cached),
            completion_tokens=int(str(usage["completion_tokens"])),
            now_s=self.clock.now_ns() / 1e9,
        )

    def refund(self, tenant: Tenant, admitted: int) -> None:
        """An admitted request that ended unanswered: nothing billed, its admission given back."""
        self.meter.release(tenant.name, admitted)

    def metrics(self) -> list[Family]:
        """Per-tenant counters for /metrics (what `cmemu usage` reads over gRPC)."""
        fields = (
            ("requests", "Requests answered"),
            ("prompt_tokens", "Prompt tokens billed"),
            ("cached_tokens", "Prompt tokens found in the EMS prefix cache"),
            ("completion_tokens", "Completion tokens billed"),
            ("rejected", "Requests refused by a rate limit or the quota (429)"),
        )
        families = []
        for name, what in fields:
            samples = [
                (
                    {"tenant": t, "priority": str(self.meter.tenants[t].priority)},
                    float(getattr(use, name)),
                )
                for t, use in self.meter.usage.items()
            ]
            families.append(
                Family(
                    name=f"cmemu_tenant_{name}_total",
                    help=f"{what}, per tenant",
                    type="counter",
                    samples=samples,
                )
            )
        return families
