"""The router's usage meter: what each tenant used through the OpenAI endpoint, as GetUsage
reports it and as the scheduler's day plans count the tokens served (engines/dayplan.py
`served_tokens`).

It lives with the serving engine, not with the endpoint (services/serving/), so that every
reader asks the one count: the endpoint charges it (its Admission holds the meter `open` made
when it started with its keys), cmemu.v1.Router/GetUsage only translates `tenants`, and a day
plan in this process reads `completion_tokens` without a gRPC call (engines/serving/local.py).
A router without an endpoint meters nothing: no tenants, no tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cmemu.emulator.model.errors import NotFoundError, quote
from cmemu.emulator.model.tenants import Meter, Tenant


@dataclass(frozen=True, kw_only=True)
class TenantUse:
    """One tenant's metered use and its class and quota (cmemu.v1.TenantUsage)."""

    tenant: str
    priority: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int
    rejected: int
    quota_tokens: int  # 0: none


class UsageMeter:
    def __init__(self) -> None:
        self.meter: Meter | None = None  # None: no endpoint, nothing metered

    def open(self, tenants: Iterable[Tenant]) -> Meter:
        """A new meter for these tenants, from now on the one every reader reads (the
        endpoint makes one when it is made, and again when it starts with its keys)."""
        self.meter = Meter(tenants)
        return self.meter

    def tenants(self, tenant: str = "") -> list[TenantUse]:
        """Each tenant's use by name, or `tenant`'s alone; NotFoundError for a tenant the
        endpoint does not know (none at all without an endpoint)."""
        meter = self.meter
        if meter is None:
            return []
        if tenant and tenant not in meter.usage:
            raise NotFoundError(
                f"no tenant {quote(tenant)}; known: {', '.join(sorted(meter.usage))}",
                field="tenant",
                subject=tenant,
                reason="TENANT_NOT_FOUND",
            )
        out = []
        for name, use in sorted(meter.usage.items()):
            if tenant and name != tenant:
                continue
            t = meter.tenants[name]
            out.append(
                TenantUse(
                    tenant=name,
                    priority=str(t.priority),
                    requests=use.requests,
                    prompt_tokens=use.prompt_tokens,
                    cached_tokens=use.cached_tokens,
                    completion_tokens=use.completion_tokens,
                    total_tokens=use.total_tokens,
                    rejected=use.rejected,
                    quota_tokens=t.quota_tokens or 0,
                )
            )
        return out

    def completion_tokens(self) -> int:
        """Completion tokens metered so far, every tenant's (what a day plan counts served)."""
        return sum(use.completion_tokens for use in self.tenants())
