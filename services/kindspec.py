"""How one device kind's wire differs from the others: its DeviceInfo hardware and its own
services (registered in services/kinds.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.services.host import Register
from cmemu.v1 import device_pb2

HardwareInfo = Callable[[DeviceEngine, device_pb2.DeviceInfo], None]


@dataclass(frozen=True, kw_only=True)
class KindSpec:
    """What a device kind (NPU, CPU, memory pool) serves beside Device and UnifiedBus, and its
    hardware."""

    hardware: HardwareInfo  # fills DeviceInfo's hardware oneof
    services: Callable[[DeviceEngine], list[tuple[str, Register]]]  # its own gRPC services
