"""Devices as the domain sees them (engines/device/engine.py), made from a topology entry."""

from __future__ import annotations

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.peers import Directory
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.memory import DeviceMemory, QueueBudget, StoreBudget
from cmemu.emulator.model.topology import Device, DeviceKind, Topology


def memory_bytes(kind: DeviceKind, profile: HardwareProfile) -> int:
    """The UB-addressable capacity at a device's EID: an NPU's HBM, a CPU's unpooled DRAM, a
    memory pool's pooled DRAM of its node's CPUs."""
    return {
        DeviceKind.NPU: profile.npu.hbm_bytes,
        DeviceKind.CPU: profile.cpu.local_bytes,
        DeviceKind.MEMPOOL: profile.pool_bytes,
    }[kind]


def dies(kind: DeviceKind, profile: HardwareProfile) -> int:
    """Compute engines that run kernels: an NPU's dies; none elsewhere."""
    return profile.npu.dies if kind is DeviceKind.NPU else 0


def make_device(
    device: Device,
    *,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Directory,
    budgets: tuple[StoreBudget, QueueBudget],
    events: EventSink | None = None,
) -> DeviceEngine:
    """A device's engine; `budgets` are the caps every device of its process shares."""
    limits = profile.limits
    store_budget, queue_budget = budgets
    return DeviceEngine(
        device=device,
        topology=topology,
        profile=profile,
        clock=clock,
        peers=peers,
        memory=DeviceMemory(
            capacity=memory_bytes(device.kind, profile),
            alignment=limits.region_alignment,
            page_bytes=limits.store_page_bytes,
            cap_bytes=limits.stored_bytes_cap_per_device,
            budget=store_budget,
            max_regions=limits.regions_max_per_device,
        ),
        dies=dies(device.kind, profile),
        queue_budget=queue_budget,
        events=events,
    )


def process_budgets(profile: HardwareProfile) -> tuple[StoreBudget, QueueBudget]:
    """The caps every device of one process shares: real bytes stored, and messages queued."""
    limits = profile.limits
    return (
        StoreBudget(cap_bytes=limits.process_stored_bytes_cap),
        QueueBudget(
            max_messages=limits.process_inbox_max_messages,
            max_bytes=limits.process_inbox_max_bytes,
        ),
    )
