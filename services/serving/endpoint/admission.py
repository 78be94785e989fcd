"""Who is asking and whether they may, now: the tenant behind an API key, its rate limits and
quota (emulator/model/tenants.py does the arithmetic on the emulated clock), its priority class,
and what it used (metered when each response's `usage` is final, so the per-tenant totals are the
sum of the responses' `usage`).

Priority classes share a deployment's decode slots: online requests go straight in; near-line
ones wait while the deployment holds `near_line_share` of its slots or more; offline ones wait
while it holds `offline_share` or more, or while anything of a higher class waits. So offline
work fills idle capacity and leaves the rest free for online arrivals (the shares are figures of
the hardware profile's serving section, `tenant_*_share`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from emulator.model.clock import Clock
from emulator.model.instruments import Family
from emulator.model.tenants import (
    DEFAULT_TENANT,
    Keys,
    Meter,
    Priority,
    QuotaExceededError,
    RateLimitedError,
    Tenant,
)
from services.serving.driver import Driver
from services.serving.endpoint.errors import HttpError, from_domain

POLL_WALL_S = 0.05  # a waiting request looks again this often (and whenever a request ends)
OPEN_TENANT = Tenant(name=DEFAULT_TENANT, key="")


@dataclass
class _Turns:
    """One deployment's requests in flight and waiting, per class."""

    running: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    waiting: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))


class Admission:
    def __init__(
        self, *, keys: Keys | None, clock: Clock, near_line_share: float, offline_share: float
    ) -> None:
        self.keys = keys
        self.clock = clock
        self.shares = {
            Priority.ONLINE: 1.0,
            Priority.NEAR_LINE: near_line_share,
            Priority.OFFLINE: offline_share,
        }
        self.meter = Meter(keys.tenants if keys is not None else (OPEN_TENANT,))
        self._turns: dict[str, _Turns] = {}
        self._changed = asyncio.Event()

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

    @contextlib.asynccontextmanager
    async def turn(self, tenant: Tenant, driver: Driver, answers: int) -> AsyncIterator[None]:
        """Hold `answers` of the deployment's slots for the block, once the tenant's class may
        run (online: at once)."""
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
        turns.running[cls] += answers
        try:
            yield
        finally:
            turns.running[cls] -= answers
            self._changed.set()

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

    def release(self, tenant: Tenant, admitted: int) -> None:
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
