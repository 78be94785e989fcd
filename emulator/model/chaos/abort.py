"""Abort conditions (a scenario's `abort:`): bounds watched while the run goes on, as Gremlin's
halt conditions and LitmusChaos's stop-on-failure probes are. Crossing one halts the attack:
every fault in is cleared at once, nothing more is injected, and the run fails saying which
bound it crossed and when. A blast that grows past what the team agreed to risk ends there,
instead of running its schedule to the end on a system already down.

Pure: a run's observer (emulator/runtime/chaos/observer.py) asks `crossed` after each poll
of the workloads and the manager."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.chaos.observed import Observations

RESTORED = "restored"  # an incident in any other state is open


@dataclass(frozen=True, kw_only=True)
class Abort:
    """At most this many failed requests since the workloads were up, at most this many
    incidents open at once: past either, the run halts."""

    failed_requests: int | None = None
    open_incidents: int | None = None


def crossed(abort: Abort, obs: Observations) -> str:
    """Which bound the observations so far cross ("" while none)."""
    if abort.failed_requests is not None:
        failed = [r for r in obs.requests if not r.ok]
        if len(failed) > abort.failed_requests:
            return f"{len(failed)} failed requests > {abort.failed_requests}"
    if abort.open_incidents is not None:
        open_now = [i for i in obs.incidents if i.state != RESTORED]
        if len(open_now) > abort.open_incidents:
            where = ", ".join(f"{i.device} ({i.state})" for i in open_now[:5])
            return f"{len(open_now)} open incidents > {abort.open_incidents}: {where}"
    return ""
