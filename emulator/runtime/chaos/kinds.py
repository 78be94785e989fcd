"""The fault kinds as the runner uses them: emulator/client/faults.py's KINDS table, each kind
with typed parameters (`params_from(dict)`), added with a target and an optional emulated
duration, cleared by the id it was given. A scenario writes `params:` once and the kind checks
it when the scenario is parsed, before anything runs."""

from __future__ import annotations

from cmemu.emulator.client import faults
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.chaos.scenario import ParamsCheck
from cmemu.emulator.model.errors import NotFoundError


def checkers() -> dict[str, ParamsCheck]:
    """Each kind's parameter check, by name: what the scenario parser is handed."""
    return {name: kind.params_from for name, kind in faults.KINDS.items()}


def help_of(name: str) -> str:
    return faults.KINDS[name].help


async def inject(
    clients: Clients, kind_name: str, target: str, params: object, duration_s: float | None
) -> faults.ActiveFault:
    """Inject one fault; `params` is what checkers()[kind_name] made of the step's params.
    With a duration, the fault's owner (the device, the fabric) clears it in emulated time."""
    return await faults.inject(clients, kind_name, target, params, duration_s)


async def clear(clients: Clients, fault_id: str) -> None:
    """Clear one fault; one already gone (its duration passed, or a controller cleared it) is
    not an error."""
    try:
        await faults.clear(clients, fault_id)
    except NotFoundError:
        return
