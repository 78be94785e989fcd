"""Domain errors of the emulator core.

The core knows nothing of gRPC: it raises these, and the service layer maps each class to a status
code in one table (services/rpc.py). Each error carries the attributes a caller needs to act on
it, not only a message:

- `reason`: a stable UPPER_SNAKE name a program can branch on (stable across releases); each class
  has a default, a raise site may name a sharper one (DEVICE_NOT_FOUND rather than NOT_FOUND);
- `field`: the request field at fault, as a path ("dst.eid"), when there is one;
- `subject`: the id of the offending thing ("n00-npu3", "f7"), when there is one;
- `retry_after_s`: set only where retrying the same request later can succeed (a faulted device, a
  route cut by a fault), in wall seconds.

The service layer may know the field or the id better than the model that raised: `blame` fills in
what a raise left unset as the error passes through.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from types import TracebackType

QUOTE_MAX = 200
"""At most this many characters of any input are echoed in a message, a log field or metadata."""

RETRY_AFTER_S = 1.0
"""The retry hint of a retryable UNAVAILABLE (a faulted device, a cut route), in wall seconds: the
emulator cannot know when a fault clears, so this is only how soon asking again is reasonable."""


def shorten(text: object, limit: int = QUOTE_MAX) -> str:
    """`text` itself when short, else its first `limit` characters and how long it was."""
    value = str(text)
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} characters)"


def quote(text: object, limit: int = QUOTE_MAX) -> str:
    """A request value as a message quotes it: repr-quoted, at most `limit` characters of it.
    Use it wherever an error echoes what the caller sent."""
    value = str(text)
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def _short(value: str | None) -> str | None:
    return None if value is None else shorten(value)


class EmulatorError(Exception):
    """Base of every error the emulator raises on purpose."""

    default_reason = "EMULATOR_ERROR"
    default_retry_after_s: float | None = None

    def __init__(
        self,
        message: str = "",
        *,
        field: str | None = None,
        subject: str | None = None,
        reason: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.field = _short(field)
        self.subject = _short(subject)
        self.reason = reason or self.default_reason
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s
        self._reason_set = reason is not None

    def annotate(
        self,
        *,
        field: str | None = None,
        subject: str | None = None,
        reason: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        """Fill in what the raise left unset; what it did set wins."""
        self.field = self.field or _short(field)
        self.subject = self.subject or _short(subject)
        if reason is not None and not self._reason_set:
            self.reason, self._reason_set = reason, True
        if self.retry_after_s is None:
            self.retry_after_s = retry_after_s


class blame:
    """Annotate (see EmulatorError.annotate) every error of class `on` raised inside the block.
    A class, not a generator: every UB transaction enters several, and a generator-based
    context manager costs a generator and its frame each time."""

    __slots__ = ("field", "on", "reason", "retry_after_s", "subject")

    def __init__(
        self,
        *,
        field: str | None = None,
        subject: str | None = None,
        reason: str | None = None,
        retry_after_s: float | None = None,
        on: type[EmulatorError] | tuple[type[EmulatorError], ...] = EmulatorError,
    ) -> None:
        self.field = field
        self.subject = subject
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.on = on

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, self.on):
            exc.annotate(
                field=self.field,
                subject=self.subject,
                reason=self.reason,
                retry_after_s=self.retry_after_s,
            )
        # None: the error (annotated or not) goes on as raised


class InvalidArgumentError(EmulatorError):
    """The request itself is malformed, whatever the state of the emulator."""

    default_reason = "INVALID_ARGUMENT"


class NotFoundError(EmulatorError):
    """A named thing (device, EID, region, preset) does not exist."""

    default_reason = "NOT_FOUND"


class UnknownNameError(NotFoundError):
    """A name looked up in a registry table; the message lists the names that do exist."""

    def __init__(
        self,
        what: str,
        name: str,
        known: Iterable[str],
        *,
        field: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.what = what
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown {what} {quote(name)}; known: {shorten(', '.join(self.known), 1000)}",
            field=field,
            subject=name,
            reason=reason or f"UNKNOWN_{what.upper().replace(' ', '_').replace('-', '_')}",
        )


class OutOfRangeError(EmulatorError):
    """An address or index outside what the device has."""

    default_reason = "OUT_OF_RANGE"


class CapacityError(EmulatorError):
    """Not enough room; says how much was asked for and what is free."""

    default_reason = "OUT_OF_CAPACITY"

    def __init__(
        self,
        what: str,
        requested: int,
        free: int,
        largest_free: int | None = None,
        *,
        unit: str = "bytes",
        field: str | None = None,
        subject: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.what = what
        self.requested = requested
        self.free = free
        self.largest_free = free if largest_free is None else largest_free
        detail = f"{free} {unit} free"
        if self.largest_free != free:
            detail += f", largest contiguous {self.largest_free} {unit}"
        super().__init__(
            f"{what}: requested {requested} {unit}, {detail}",
            field=field,
            subject=subject,
            reason=reason,
        )


class PreconditionError(EmulatorError):
    """The request is well formed but the state does not allow it (e.g. memory not allocated)."""

    default_reason = "FAILED_PRECONDITION"


class UnavailableError(EmulatorError):
    """The device is faulted or stopping; the caller may retry elsewhere or later.

    Retryable only when `retry_after_s` is set (by the raise, or by `blame` where the cause is
    known to pass: a faulted device, a route cut by a fault, an unreachable peer)."""

    default_reason = "UNAVAILABLE"


class AddressInUseError(EmulatorError):
    """A device's address could not be bound: another process (or device) holds it."""

    default_reason = "ADDRESS_IN_USE"

    def __init__(self, device: str, address: str) -> None:
        self.device = device
        self.address = address
        super().__init__(
            f"cannot bind {device} to {address}: address already in use", subject=device
        )


class AddressError(EmulatorError):
    """A device's address cannot be used at all: its host name does not resolve (or, reason
    ADDRESS_UNUSABLE, the system refuses it for another cause: not this machine's, no
    permission)."""

    default_reason = "ADDRESS_UNRESOLVABLE"

    def __init__(
        self, device: str, address: str, detail: str, *, reason: str | None = None
    ) -> None:
        self.device = device
        self.address = address
        super().__init__(
            f"cannot bind {device} to {address}: {detail}", subject=device, reason=reason
        )


def bind_error(who: str, address: str, exc: OSError) -> EmulatorError:
    """What a failed bind of an HTTP or other socket server says: only EADDRINUSE is "in use";
    an unresolvable host (socket.gaierror) or another refusal (EADDRNOTAVAIL, EACCES) says so,
    so that a typo in a host name does not send anyone hunting for the process on a port."""
    if exc.errno == errno.EADDRINUSE:
        return AddressInUseError(who, address)
    from cmemu.emulator.model.address import host_of  # it reports with these errors

    host = host_of(address)
    if isinstance(exc, socket.gaierror):
        return AddressError(who, address, f"cannot resolve {host} ({exc.strerror or exc})")
    return AddressError(who, address, exc.strerror or str(exc), reason="ADDRESS_UNUSABLE")


class DataLossError(EmulatorError):
    """Stored bytes no longer match their checksum, and no good copy is left."""

    default_reason = "DATA_LOSS"


class DeadlineExceededError(EmulatorError):
    """A call did not answer within its deadline (a hung peer, a stalled host)."""

    default_reason = "DEADLINE_EXCEEDED"


class UnauthenticatedError(EmulatorError):
    """No valid credentials for a state-changing call."""

    default_reason = "UNAUTHENTICATED"


class PermissionDeniedError(EmulatorError):
    """Credentials that do not allow this call."""

    default_reason = "PERMISSION_DENIED"


class InternalError(EmulatorError):
    """An exception that is no EmulatorError: a bug of the emulator, never of the request (or a
    status a peer sent that has no class of its own)."""

    default_reason = "INTERNAL"


def relayed(error: EmulatorError, prefix: str) -> EmulatorError:
    """The same error (class, reason, field, id, retry hint), its message prefixed with who
    relayed it ("n00-npu3: ..."), as a status relayed from another device reads."""
    text = str(error)
    if text.startswith(f"{prefix}: "):
        return error
    copy = error.__class__.__new__(error.__class__)
    copy.__dict__.update(error.__dict__)
    copy.args = (f"{prefix}: {text}",)
    return copy


CODES = frozenset({
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
})  # fmt: skip
"""The canonical error codes (google.rpc.Code) by name: what any status says, on any wire."""

CODE_OF: dict[type[EmulatorError], str] = {
    InvalidArgumentError: "INVALID_ARGUMENT",
    NotFoundError: "NOT_FOUND",
    OutOfRangeError: "OUT_OF_RANGE",
    CapacityError: "RESOURCE_EXHAUSTED",
    PreconditionError: "FAILED_PRECONDITION",
    UnavailableError: "UNAVAILABLE",
    AddressInUseError: "UNAVAILABLE",
    AddressError: "INVALID_ARGUMENT",
    DataLossError: "DATA_LOSS",
    DeadlineExceededError: "DEADLINE_EXCEEDED",
    UnauthenticatedError: "UNAUTHENTICATED",
    PermissionDeniedError: "PERMISSION_DENIED",
    InternalError: "INTERNAL",
}
"""The canonical code each error class reports (a subclass: its nearest listed base's; none:
INTERNAL). The one table: the gRPC layer's (emulator/client/status.py) is read from it, so an
engine names an error's code as a status would without knowing the wire."""


def code_of(error: EmulatorError) -> str:
    """The canonical code `error` reports; an InternalError a client read back from a status it
    has no class for (UNIMPLEMENTED, UNKNOWN) keeps that status's code as its reason."""
    if isinstance(error, InternalError) and error.reason in CODES:
        return error.reason
    for cls in type(error).__mro__:
        if cls in CODE_OF:
            return CODE_OF[cls]
    return "INTERNAL"


def error_line(error: BaseException) -> str:
    """An error as one line (`CODE: message`), for an event or a log that must say what went
    wrong without a traceback; an exception that is no EmulatorError by its class's name."""
    if isinstance(error, EmulatorError):
        return f"{code_of(error)}: {error}"
    return f"{type(error).__name__}: {error}"
