"""The fabric service down while its engine runs on: engines/outage.py's Outage, named for the
fabric. Time is not the fabric's to lose: the emulator's clock, which its server also tells,
keeps running (those calls are exempt from its gate: runtime/servicecontrol.py)."""

from __future__ import annotations

from cmemu.emulator.engines.outage import RETRY_AFTER_S, Outage

__all__ = ["REASON", "RETRY_AFTER_S", "Outage", "fabric_outage"]

REASON = "FABRIC_DOWN"


def fabric_outage() -> Outage:
    return Outage("fabric", REASON)
