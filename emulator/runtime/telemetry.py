"""What a process publishes of its devices' telemetry on the event bus, while it serves.

Every device's sample, every telemetry interval of emulated time, spread over the interval in
small batches. One process publishes at most telemetry_max_per_s samples a second: past that
(thousands of devices in one process, or a fast time_scale) the interval stretches rather than
the process drowning in MQTT.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog
from google.protobuf.json_format import MessageToDict

from cmemu.emulator.client.wire.device import telemetry_proto
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.emulator.runtime.events import EventBus

log = structlog.get_logger("cmemu.inprocess")
BATCH = 64  # devices sampled at once


async def publish_telemetry(
    engines: Sequence[DeviceEngine],
    *,
    events: EventBus,
    clock: Timeline,
    limits: EmulatorLimits,
    stopping: asyncio.Event,
) -> None:
    """Sample and publish until `stopping` is set (a dead agent, crashed or hung, reports
    nothing; one device's bad sample never ends everyone's)."""
    batches = max(1, -(-len(engines) // BATCH))
    # a stop before this task first ran has emptied the devices: nothing to wait for
    while engines and not stopping.is_set():
        interval = max(
            clock.clock.wall_delay_s(limits.telemetry_interval_s),
            len(engines) / limits.telemetry_max_per_s,
        )
        for start in range(0, len(engines), BATCH):
            if await _stopped_within(stopping, interval / batches):
                return
            for engine in engines[start : start + BATCH]:
                if engine.silent:  # crashed or hung: a dead agent reports nothing
                    continue
                try:
                    sample = MessageToDict(
                        telemetry_proto(engine.telemetry()), preserving_proto_field_name=True
                    )
                except Exception:  # one device's bad sample must not end everyone's
                    log.exception("telemetry sample failed", device=engine.device.id)
                    continue
                events.telemetry(engine.device.id, sample)


async def _stopped_within(stopping: asyncio.Event, wall_s: float) -> bool:
    """Wait up to wall_s; True as soon as the process is stopping."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wall_s):
            await stopping.wait()
    return stopping.is_set()
