"""Domain errors to gRPC statuses, in one table, and the decorator that applies it.

Every RPC handler of every service is wrapped by `rpc`, so a bad request always ends in a precise
status with a readable message and the server keeps serving; the core stays free of gRPC.

A status also carries google.rpc details a program can act on (the gRPC richer error model, sent
in the `grpc-status-details-bin` trailer through grpcio-status):
- always an ErrorInfo: a stable `reason` (EmulatorError.reason), domain "cmemu.emulator", and
  metadata naming the offending `field` and `id` when known;
- on INVALID_ARGUMENT a BadRequest with one field violation;
- on a retryable UNAVAILABLE (the error's `retry_after_s` is set) a RetryInfo.
A status relayed from another device (RemoteError) keeps the details that device sent.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar, cast

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from emulator.client.errors import DOMAIN, status_in
from emulator.model.errors import (
    RETRY_AFTER_S,
    AddressInUseError,
    CapacityError,
    DataLossError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    UnavailableError,
)

STATUS_OF: dict[type[EmulatorError], grpc.StatusCode] = {
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    CapacityError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    UnavailableError: grpc.StatusCode.UNAVAILABLE,
    AddressInUseError: grpc.StatusCode.UNAVAILABLE,
    DataLossError: grpc.StatusCode.DATA_LOSS,
}


def status_of(error: EmulatorError) -> grpc.StatusCode:
    """The status of the nearest registered base class (subclasses inherit their parent's)."""
    if isinstance(error, RemoteError):
        return error.code
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


def _pack(message: Any) -> any_pb2.Any:
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
    if isinstance(error, CapacityError):
        metadata.update(requested=str(error.requested), free=str(error.free))
    return metadata


def details_of(error: EmulatorError) -> list[any_pb2.Any]:
    """The google.rpc details of an error raised here (RemoteError keeps its own)."""
    if isinstance(error, RemoteError):
        return list(error.details)
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
            field=error.field or "", description=str(error)
        )
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    if code is grpc.StatusCode.UNAVAILABLE and error.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(error.retry_after_s * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    return details


def to_status(error: EmulatorError, message: str | None = None) -> grpc.Status:
    """The grpc.Status (code, message, details trailer) that reports `error`."""
    code = status_of(error)
    return rpc_status.to_status(
        status_pb2.Status(
            code=code.value[0],
            message=str(error) if message is None else message,
            details=details_of(error),
        )
    )


def details_from_metadata(metadata: object) -> list[any_pb2.Any]:
    """The google.rpc details in a status's trailing metadata (none when it has no trailer)."""
    status = status_in(metadata)
    return [] if status is None else list(status.details)


class RemoteError(EmulatorError):
    """A status returned by another device, relayed to our own caller with its details."""

    def __init__(
        self, code: grpc.StatusCode, details: str, rich: Sequence[any_pb2.Any] = ()
    ) -> None:
        self.code = code
        self.details = tuple(rich)
        super().__init__(details, reason=_reason_in(self.details))

    def prefixed(self, prefix: str) -> RemoteError:
        """The same status, its message prefixed with who relayed it ("n00-npu3: ...")."""
        return RemoteError(self.code, f"{prefix}: {self}", self.details)

    @classmethod
    def from_error(cls, error: EmulatorError, prefix: str) -> RemoteError:
        """An error of an in-process peer, as the status it would have sent."""
        return cls(status_of(error), f"{prefix}: {error}", details_of(error))

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError, prefix: str | None) -> RemoteError:
        """A status received from a gRPC peer, its details (the trailer) kept. An UNAVAILABLE
        without details came from the transport, not from the peer: the peer is unreachable,
        which a retry can outlast (reason PEER_UNREACHABLE, with a RetryInfo)."""
        message = f"{prefix}: " if prefix else ""
        message += error.details() or error.code().name
        details = details_from_metadata(error.trailing_metadata())
        if not details and error.code() is grpc.StatusCode.UNAVAILABLE:
            unreachable = UnavailableError(
                message,
                subject=prefix or "fabric",
                reason="PEER_UNREACHABLE",
                retry_after_s=RETRY_AFTER_S,
            )
            details = details_of(unreachable)
        return cls(error.code(), message, details)


def _reason_in(details: Iterable[any_pb2.Any]) -> str | None:
    for detail in details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason or None
    return None


Context = grpc.aio.ServicerContext[Any, Any]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

log = structlog.get_logger("cmemu.rpc")


async def abort(context: Context, error: EmulatorError) -> NoReturn:
    """End an RPC with the status of `error`, details included (for handlers not under `rpc`)."""
    # grpc-stubs lacks the aio context's abort_with_status; it raises, like abort
    await cast(Any, context).abort_with_status(to_status(error))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


def rpc(handler: F) -> F:
    """Turn EmulatorErrors raised by a handler into the status of STATUS_OF, with details."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Context) -> Any:
        try:
            return await handler(self, request, context)
        except RemoteError as exc:
            await abort(context, exc)
        except EmulatorError as exc:
            code = status_of(exc)
            state = getattr(self, "state", None)  # a device's state, or a service's (name)
            device = getattr(getattr(state, "device", None), "id", getattr(state, "name", None))
            log.info(
                "rejected",
                device=device,
                rpc=handler.__qualname__,
                code=code.name,
                reason=exc.reason,
                error=str(exc),
            )
            await abort(context, exc)

    return cast(F, wrapper)
