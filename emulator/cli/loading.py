"""How long `cmemu serve-model` will wait, said before it waits (issue 24 item 6).

Loading DeepSeek-R1's weights is emulated time (the published model-caching figures: cold from
object storage, or from EMS): at time scale 1 a cold load of the published layout is about 37
minutes of wall time. So serve-model prints the emulated and the wall time of the load it starts,
and what would make it shorter: a warm start (`--warm`: the weights already in EMS) or a faster
time scale (`cmemu up --time-scale X`, whichever brings it under `TARGET_WALL_S`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from cmemu.emulator.client.deployments import Deployment, DeploymentState
from cmemu.emulator.client.router import RouterClient

TARGET_WALL_S = 60.0  # a first try should load within a minute of wall time
POLL_S = 0.5
SHOW_EVERY_S = 15.0


def wall(seconds: float) -> str:
    """`95 s`, `12 min 40 s`, `1 h 02 min`."""
    s = round(seconds)
    if s < 100:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def advice(d: Deployment, time_scale: float, *, warm: bool) -> list[str]:
    """What the load will take, and how to take less."""
    w = d.weights
    load_s = (w.from_ems_ns if w.source == "ems" else w.cold_ns) / 1e9
    where = "from EMS" if w.source == "ems" else "cold, from object storage"
    lines = [
        f"loading {w.bytes / 1e9:.0f} GB of weights {where}: {load_s:,.0f} s emulated, "
        f"{wall(load_s / time_scale)} of wall time at time scale {time_scale:g}"
    ]
    if load_s / time_scale <= TARGET_WALL_S:
        return lines
    if w.source != "ems" and not warm:
        from_ems = w.from_ems_ns / 1e9
        lines.append(
            f"  a warm start (weights already in EMS: serve-model --warm) loads in "
            f"{from_ems:,.0f} s emulated, {wall(from_ems / time_scale)} wall"
        )
    scale = math.ceil(load_s / TARGET_WALL_S)
    lines.append(
        f"  at time scale {scale} (cmemu up --time-scale {scale}) this load takes "
        f"{wall(load_s / scale)} of wall time"
    )
    return lines


async def wait_serving(
    router: RouterClient,
    name: str,
    time_scale: float,
    say: Callable[[str], None],
) -> Deployment:
    """Poll until the deployment leaves LOADING; say how far it is now and then."""
    started = time.monotonic()
    shown = started
    while True:
        d = await router.get(name)
        if d.state is not DeploymentState.LOADING:
            return d
        now = time.monotonic()
        if now - shown >= SHOW_EVERY_S:
            shown = now
            w = d.weights
            load_s = (w.from_ems_ns if w.source == "ems" else w.cold_ns) / 1e9
            left = max(0.0, load_s / time_scale - (now - started))
            say(f"  still loading: about {wall(left)} of wall time left")
        await asyncio.sleep(POLL_S)
