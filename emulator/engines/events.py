"""What a servicer needs of the event stream: somewhere to put events and telemetry.

The runtime's MQTT event bus is one such sink; servicers see only this protocol, so the service
layer never imports the runtime that hosts it.
"""

from __future__ import annotations

from typing import Any, Protocol


class EventSink(Protocol):
    @property
    def connected(self) -> bool: ...

    @property
    def pending(self) -> int: ...

    @property
    def dropped(self) -> int: ...

    def event(self, device: str, event: str, emulated_ns: int, **detail: Any) -> None: ...

    def telemetry(self, device: str, sample: dict[str, Any]) -> None: ...
