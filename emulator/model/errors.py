"""Domain errors of the emulator core.

The core knows nothing of gRPC: it raises these, and the service layer maps each class to a status
code in one table (services/status.py). Each error carries the attributes a caller needs to act on
it, not only a message.
"""

from __future__ import annotations

from collections.abc import Iterable


class EmulatorError(Exception):
    """Base of every error the emulator raises on purpose."""


class InvalidArgumentError(EmulatorError):
    """The request itself is malformed, whatever the state of the emulator."""


class NotFoundError(EmulatorError):
    """A named thing (device, EID, region, preset) does not exist."""


class UnknownNameError(NotFoundError):
    """A name looked up in a registry table; the message lists the names that do exist."""

    def __init__(self, what: str, name: str, known: Iterable[str]) -> None:
        self.what = what
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {what} {name!r}; known: {', '.join(self.known)}")


class OutOfRangeError(EmulatorError):
    """An address or index outside what the device has."""


class CapacityError(EmulatorError):
    """Not enough room; says how much was asked for and what is free."""

    def __init__(
        self,
        what: str,
        requested: int,
        free: int,
        largest_free: int | None = None,
        *,
        unit: str = "bytes",
    ) -> None:
        self.what = what
        self.requested = requested
        self.free = free
        self.largest_free = free if largest_free is None else largest_free
        detail = f"{free} {unit} free"
        if self.largest_free != free:
            detail += f", largest contiguous {self.largest_free} {unit}"
        super().__init__(f"{what}: requested {requested} {unit}, {detail}")


class PreconditionError(EmulatorError):
    """The request is well formed but the state does not allow it (e.g. memory not allocated)."""


class UnavailableError(EmulatorError):
    """The device is faulted or stopping; the caller may retry elsewhere or later."""


class AddressInUseError(EmulatorError):
    """A device's address could not be bound: another process (or device) holds it."""

    def __init__(self, device: str, address: str) -> None:
        self.device = device
        self.address = address
        super().__init__(f"cannot bind {device} to {address}: address already in use")


class DataLossError(EmulatorError):
    """Stored bytes no longer match their checksum, and no good copy is left."""
