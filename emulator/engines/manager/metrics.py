"""The cluster manager's Prometheus families: what its detection costs (beats, streams,
collective arrivals read) and what it finds (devices by state, stragglers, incidents by
state). Read from the engine at each scrape; nothing is counted for them on a hot path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from cmemu.emulator.model.instruments import Family
from cmemu.emulator.model.manager.detector import STATES

if TYPE_CHECKING:
    from cmemu.emulator.engines.manager.engine import ManagerEngine


def manager_families(engine: ManagerEngine) -> Iterator[Family]:
    states = engine.detector.devices
    by_state: dict[str, int] = {}
    for incident in engine.detector.incidents:
        by_state[incident.state] = by_state.get(incident.state, 0) + 1
    watch, s = engine.watch, engine.stragglers
    yield Family(
        name="cmemu_manager_liveness_beats_total",
        help="Liveness beats the cluster manager has received (one per process per beat)",
        type="counter",
        samples=[({}, float(watch.beats))],
    )
    yield Family(
        name="cmemu_manager_liveness_streams",
        help="Liveness streams the cluster manager has opened (one per process)",
        type="counter",
        samples=[({}, float(watch.streams))],
    )
    yield Family(
        name="cmemu_manager_liveness_hung_opens_total",
        help="Liveness stream opens dropped for bringing no first beat in time (hung connections)",
        type="counter",
        samples=[({}, float(watch.hung_opens))],
    )
    yield Family(
        name="cmemu_manager_devices",
        help="Devices the cluster manager watches, by detection state",
        type="gauge",
        samples=[
            ({"state": st}, float(sum(states.get(d) == st for d in engine.devices)))
            for st in STATES
        ],
    )
    yield Family(
        name="cmemu_manager_stragglers_detected_total",
        help="NPUs the cluster manager found arriving last at their collectives (stragglers)",
        type="counter",
        samples=[({}, float(s.detected))],
    )
    yield Family(
        name="cmemu_manager_collective_arrivals_total",
        help="Collectives whose ranks' arrivals the cluster manager has judged",
        type="counter",
        samples=[({}, float(s.arrivals))],
    )
    yield Family(
        name="cmemu_manager_incidents",
        help="Incidents the cluster manager has recorded, by state",
        type="gauge",
        samples=[({"state": st}, float(n)) for st, n in sorted(by_state.items())],
    )
