"""Domain errors to gRPC status codes, in one table, and the decorator that applies it.

Every RPC handler of every service is wrapped by `rpc`, so a bad request always ends in a precise
status with a readable message and the server keeps serving; the core stays free of gRPC.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
import structlog

from emulator.model.errors import (
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
    for cls in type(error).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


class RemoteError(EmulatorError):
    """A status returned by another device, relayed unchanged to our own caller."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        super().__init__(details)


Context = grpc.aio.ServicerContext[Any, Any]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

log = structlog.get_logger("cmemu.rpc")


def rpc(handler: F) -> F:
    """Turn EmulatorErrors raised by a handler into the status of STATUS_OF."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Context) -> Any:
        try:
            return await handler(self, request, context)
        except RemoteError as exc:
            await context.abort(exc.code, str(exc))
        except EmulatorError as exc:
            code = status_of(exc)
            state = getattr(self, "state", None)  # a device's state, or a service's (name)
            device = getattr(getattr(state, "device", None), "id", getattr(state, "name", None))
            log.info(
                "rejected", device=device, rpc=handler.__qualname__, code=code.name, error=str(exc)
            )
            await context.abort(code, str(exc))

    return cast(F, wrapper)
