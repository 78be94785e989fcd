"""Domain errors and gRPC statuses, both ways, in one table.

A server turns an EmulatorError into a status with google.rpc details (services/rpc.py applies
`to_status`); a client turns a status back into the EmulatorError of the same class, reason,
field, id and retry hint (`error_from`). So a caller sees one error type whether its peer lives in
its process or behind gRPC, and a status relayed through several hops keeps what its origin said.

The details every status carries:
- an ErrorInfo: a stable `reason` (EmulatorError.reason), domain "cmemu.emulator", and metadata
  naming the offending `field` and `id` when known (and what a CapacityError measured);
- on INVALID_ARGUMENT a BadRequest with one field violation;
- on a retryable UNAVAILABLE or RESOURCE_EXHAUSTED (the error's `retry_after_s` is set) a
  RetryInfo.
Whatever a request held, a status stays small: its message is cut at MESSAGE_MAX characters and
each metadata value at QUOTE_MAX.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cmemu.emulator.client.errors import DOMAIN, ErrorDetails, decode
from cmemu.emulator.model.errors import (
    CODE_OF,
    QUOTE_MAX,
    RETRY_AFTER_S,
    CapacityError,
    DataLossError,
    DeadlineExceededError,
    EmulatorError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnavailableError,
    code_of,
    shorten,
)

MESSAGE_MAX = 1024
"""The longest status message (and BadRequest description) a server sends, in characters."""

STATUS_OF: dict[type[EmulatorError], grpc.StatusCode] = {
    cls: grpc.StatusCode[code] for cls, code in CODE_OF.items()
}
"""Each error class's status: the domain's table of canonical codes (model/errors.py)."""

ERROR_OF: dict[grpc.StatusCode, type[EmulatorError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: CapacityError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}
"""The class a status comes back as (any other code: InternalError, its reason the code)."""


T = TypeVar("T")


def status_of(error: EmulatorError) -> grpc.StatusCode:
    """The status of the nearest registered base class (subclasses inherit their parent's)."""
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


def code_name(error: EmulatorError) -> str:
    """The name of the status `error` reports, or came back from (`error_from` keeps a code it
    has no class for, UNKNOWN or UNIMPLEMENTED, as an InternalError's reason): the model's
    `code_of`, the one table of codes."""
    return code_of(error)


def error_details(error: EmulatorError) -> ErrorDetails:
    """What the status that reports `error` says, as `decode` reads one: so a caller that
    branches on code and reason reads an in-process error and a remote one alike."""
    metadata = error_metadata(error)
    return ErrorDetails(
        code=grpc.StatusCode[code_name(error)],
        message=str(error),
        reason=error.reason,
        domain=DOMAIN,
        metadata=metadata,
        violations=((error.field or "", str(error)),)
        if status_of(error) is grpc.StatusCode.INVALID_ARGUMENT
        else (),
        retry_after_s=error.retry_after_s,
    )


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def error_metadata(error: EmulatorError) -> dict[str, str]:
    """ErrorInfo metadata: the offending field and id, and what a CapacityError measured."""
    metadata: dict[str, str] = {}
    if error.field:
        metadata["field"] = error.field
    if error.subject:
        metadata["id"] = error.subject
    if isinstance(error, CapacityError) and hasattr(error, "requested"):
        metadata.update(requested=str(error.requested), free=str(error.free))
    return {key: shorten(value, QUOTE_MAX) for key, value in metadata.items()}


def details_of(error: EmulatorError) -> list[any_pb2.Any]:
    """The google.rpc details that report `error`."""
    code = status_of(error)
    details = [
        _pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason, domain=DOMAIN, metadata=error_metadata(error)
            )
        )
    ]
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=shorten(error.field or "", QUOTE_MAX),
            description=shorten(str(error), MESSAGE_MAX),
        )
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    if (
        code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
        and error.retry_after_s is not None
    ):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(error.retry_after_s * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return details


def to_status(error: EmulatorError, message: str | None = None) -> grpc.Status:
    """The grpc.Status (code, message, details trailer) that reports `error`."""
    return rpc_status.to_status(
        status_pb2.Status(
            code=status_of(error).value[0],
            message=shorten(str(error) if message is None else message, MESSAGE_MAX),
            details=details_of(error),
        )
    )


def error_from(error: grpc.aio.AioRpcError, prefix: str | None = None) -> EmulatorError:
    """The EmulatorError a status reports: its class by code, its reason, field, id and retry
    hint from the details. An UNAVAILABLE without details came from the transport, not from the
    peer: the peer is unreachable, which a retry can outlast (reason PEER_UNREACHABLE)."""
    d = decode(error)
    message = (f"{prefix}: " if prefix else "") + (d.message or d.code.name)
    cls = ERROR_OF.get(d.code, InternalError)
    out = cls.__new__(cls)
    reason = d.reason or (d.code.name if cls is InternalError else None)
    retry = d.retry_after_s
    subject = d.metadata.get("id") or None
    if d.reason is None and d.code is grpc.StatusCode.UNAVAILABLE:
        reason, retry, subject = "PEER_UNREACHABLE", RETRY_AFTER_S, prefix or "fabric"
    EmulatorError.__init__(
        out,
        message,
        field=d.metadata.get("field") or None,
        subject=subject,
        reason=reason,
        retry_after_s=retry,
    )
    if isinstance(out, CapacityError):
        out.what = message
        out.requested = _int(d.metadata.get("requested"))
        out.free = out.largest_free = _int(d.metadata.get("free"))
    return out


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


async def reply_of(prefix: str | None, call: Awaitable[T]) -> T:
    """A call's reply, or the EmulatorError its status reports (`error_from`): the one
    translation of a remote failure every typed client makes."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise error_from(exc, prefix) from None
