"""The devices one process hosts: each device's engine and server, the siblings through which
a crashed device's faults go, and the liveness beats the cluster manager watches.

Every launcher that hosts devices in a process (in process: all of them; procs and compose: a
node's or one) makes them here, so that what a device is in a process is written once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.engines.device import faults as device_faults
from cmemu.emulator.engines.device import make_device, process_budgets
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.engines.device.liveness import Liveness
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.skewclock import LocalClock
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology
from cmemu.services.kinds import DeviceServer
from cmemu.services.peers import Peers


@dataclass(frozen=True, kw_only=True)
class HostedDevices:
    """The devices one process hosts: their engines, servers, siblings and liveness."""

    engines: dict[str, DeviceEngine]
    servers: dict[str, DeviceServer]
    siblings: device_faults.Siblings
    liveness: Liveness


def host_devices(
    topology: Topology,
    hosted: Collection[str],
    *,
    profile: HardwareProfile,
    keeper: TimeKeeper,
    peers: Peers,
    events: EventSink | None,
    process: str,
) -> HostedDevices:
    """The hosted devices' engines and servers; the engines reach each other directly."""
    budgets = process_budgets(profile)
    # The host clock its devices stamp with (and clock-skew makes wrong): one for all of a
    # process that follows the owner's clock (procs, compose: one host); in the process
    # that owns time (in process: the whole emulator) one per device, since skewing the
    # owner's own reading would move everything with it (engines/device/kinds/clock_skew.py).
    shared = LocalClock(keeper.timeline) if keeper.follower is not None else None
    engines: dict[str, DeviceEngine] = {}
    servers: dict[str, DeviceServer] = {}
    for d in topology.devices:
        if d.id not in hosted:
            continue
        engine = make_device(
            d,
            topology=topology,
            profile=profile,
            clock=shared or LocalClock(keeper.timeline),
            peers=peers,
            budgets=budgets,
            events=events,
        )
        peers.host_device(engine)
        engines[d.id] = engine
        servers[d.id] = DeviceServer(engine)
    return HostedDevices(
        engines=engines,
        servers=servers,
        # a crashed device's faults go through its siblings (emulator/engines/device/faults.py)
        siblings=device_faults.join(engines),
        liveness=Liveness(
            engines,
            shared or keeper.timeline,  # its beats carry its host's time
            interval_s=profile.manager.heartbeat_interval_s,
            process=process,
        ),
    )
