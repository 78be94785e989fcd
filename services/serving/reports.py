"""What the router reports of its deployments: the tenants' metered use (`Router/Usage`, the
billing export of `cmemu usage`) and the serving figures of `/metrics`.

Both are read-only views built from the router's live objects at the moment they are asked,
kept apart from RouterState so that the state holds deployments and their tasks, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cmemu.emulator.model.errors import NotFoundError, quote
from cmemu.emulator.model.instruments import Family, Histogram, MetricType
from cmemu.emulator.model.tenants import Meter
from cmemu.services.serving.driver import Driver
from cmemu.services.serving.pdlive import SWITCHING
from cmemu.services.serving.stats import ServingStats
from cmemu.v1 import router_pb2


def usage_report(meter: Meter | None, now_ns: int, tenant: str) -> router_pb2.UsageReport:
    """Each tenant's metered use, or `tenant`'s alone; NotFoundError for a tenant the endpoint
    does not know. Without an endpoint (`meter` None) nothing was metered: an empty report."""
    report = router_pb2.UsageReport(at_ns=now_ns)
    if meter is None:
        return report
    if tenant and tenant not in meter.usage:
        raise NotFoundError(
            f"no tenant {quote(tenant)}; known: {', '.join(sorted(meter.usage))}",
            field="tenant",
            subject=tenant,
            reason="TENANT_NOT_FOUND",
        )
    for name, use in sorted(meter.usage.items()):
        if tenant and name != tenant:
            continue
        t = meter.tenants[name]
        report.tenants.append(
            router_pb2.TenantUsage(
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
    return report


def serving_families(
    drivers: Mapping[str, Driver], pd_units: Mapping[str, Mapping[str, int]]
) -> list[Family]:
    """Serving figures per deployment (emulated seconds, tokens), and the instances per role
    of each deployment under live dynamic PD (`pd_units`: deployment -> role -> count)."""
    label = [({"deployment": name}, driver.stats) for name, driver in drivers.items()]

    def hist(name: str, what: str, pick: Callable[[ServingStats], Histogram]) -> Family:
        samples = [(labels, pick(s).snapshot()) for labels, s in label]
        return Family(name=name, help=f"{what} (emulated)", type="histogram", samples=samples)

    def count(
        name: str, what: str, kind: MetricType, pick: Callable[[ServingStats], int]
    ) -> Family:
        samples = [(labels, float(pick(s))) for labels, s in label]
        return Family(name=name, help=what, type=kind, samples=samples)

    units = [
        ({"deployment": name, "role": role}, float(n))
        for name, roles in pd_units.items()
        for role, n in roles.items()
    ]
    pd = Family(
        name="cmemu_serving_pd_units",
        help=f"Instances per role under live dynamic PD (prefill, decode, {SWITCHING})",
        type="gauge",
        samples=units,
    )
    return [
        *([pd] if units else []),
        hist("cmemu_serving_ttft_seconds", "Time to first token", lambda s: s.ttft_s),
        hist("cmemu_serving_tpot_seconds", "Time per output token", lambda s: s.tpot_s),
        hist("cmemu_serving_queueing_seconds", "Arrival to prefill", lambda s: s.queueing_s),
        count(
            "cmemu_serving_completion_tokens_total",
            "Output tokens generated",
            "counter",
            lambda s: s.completion_tokens,
        ),
        count(
            "cmemu_serving_requests_finished_total",
            "Requests finished (completed or cancelled)",
            "counter",
            lambda s: len(s.finished),
        ),
        count(
            "cmemu_serving_requests_in_flight",
            "Requests admitted and not finished",
            "gauge",
            lambda s: s.in_flight,
        ),
    ]
