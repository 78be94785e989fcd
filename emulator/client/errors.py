"""What a failed call's status says beyond its code: the google.rpc details the emulator sends.

Every error status of the emulator carries an ErrorInfo (a stable `reason` such as
DEVICE_NOT_FOUND, domain "cmemu.emulator", metadata naming the offending `field` and `id`), a
BadRequest on INVALID_ARGUMENT, and a RetryInfo on an UNAVAILABLE that a retry can outlast (a
faulted device, a route cut by a fault, an unreachable peer). `decode` reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import grpc
from google.rpc import error_details_pb2, status_pb2

DOMAIN = "cmemu.emulator"
DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True, kw_only=True)
class ErrorDetails:
    """A gRPC error's status and its rich details (ErrorInfo, BadRequest, RetryInfo), as a program
    branches on them."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None  # ErrorInfo.reason: what a program branches on
    domain: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # e.g. {"field": "dst.eid", "id": ...}
    violations: tuple[tuple[str, str], ...] = ()  # BadRequest: (field, description) pairs
    retry_after_s: float | None = None  # RetryInfo: set only when retrying can succeed

    @property
    def retryable(self) -> bool:
        return self.retry_after_s is not None


def decode(error: grpc.aio.AioRpcError) -> ErrorDetails:
    """The code, message and google.rpc details of a failed call (empty where none were sent)."""
    code, message = error.code(), error.details() or ""
    status = _status(error)
    if status is None:
        return ErrorDetails(code=code, message=message)
    reason: str | None = None
    domain: str | None = None
    metadata: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    retry_after_s: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after_s = retry.retry_delay.ToNanoseconds() / 1e9
    return ErrorDetails(
        code=code,
        message=message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        violations=tuple(violations),
        retry_after_s=retry_after_s,
    )


def describe(error: grpc.aio.AioRpcError) -> str:
    """One line for a person: `NOT_FOUND (DEVICE_NOT_FOUND): no device 'x'` (the reason left
    out where it only repeats the code)."""
    details = decode(error)
    shown = details.reason and details.reason != details.code.name
    reason = f" ({details.reason})" if shown else ""
    return f"{details.code.name}{reason}: {details.message}"


def _status(error: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    return status_in(error.trailing_metadata())


def status_in(metadata: object) -> status_pb2.Status | None:
    """The google.rpc.Status in trailing metadata (a grpc.aio.Metadata, or the (key, value) pairs
    of a grpc.Status), if the status carried one."""
    for item in cast(Iterable[tuple[str, str | bytes]], metadata or ()):
        key, value = item
        if key == DETAILS_KEY and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return None
