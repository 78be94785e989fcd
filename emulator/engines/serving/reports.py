"""What the router reports of its deployments on `/metrics`: the serving figures per deployment
and live dynamic PD's split, a read-only view built from the live drivers at the moment it is
asked, kept apart from the engine (engine.py) so that it holds deployments and their tasks,
nothing more. (The tenants' metered use is the HTTP endpoint's: services/serving/wire.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.engines.serving.pdlive import SWITCHING
from cmemu.emulator.engines.serving.stats import DeploymentStats
from cmemu.emulator.model.instruments import Family, Histogram, MetricType


def serving_families(
    drivers: Mapping[str, Driver], pd_units: Mapping[str, Mapping[str, int]]
) -> list[Family]:
    """Serving figures per deployment (emulated seconds, tokens), and the instances per role
    of each deployment under live dynamic PD (`pd_units`: deployment -> role -> count)."""
    label = [({"deployment": name}, driver.stats) for name, driver in drivers.items()]

    def hist(name: str, what: str, pick: Callable[[DeploymentStats], Histogram]) -> Family:
        samples = [(labels, pick(s).snapshot()) for labels, s in label]
        return Family(name=name, help=f"{what} (emulated)", type="histogram", samples=samples)

    def count(
        name: str, what: str, kind: MetricType, pick: Callable[[DeploymentStats], int]
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
