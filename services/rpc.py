"""What every RPC handler goes through (so named: not a status service): domain errors to gRPC
statuses, in one table, and the decorator that applies it.

Every RPC handler of every service is wrapped by `rpc`, so a bad request always ends in a precise
status with a readable message and the server keeps serving; the core stays free of gRPC.

A status also carries google.rpc details a program can act on (the gRPC richer error model, sent
in the `grpc-status-details-bin` trailer through grpcio-status):
- always an ErrorInfo: a stable `reason` (EmulatorError.reason), domain "cmemu.emulator", and
  metadata naming the offending `field` and `id` when known;
- on INVALID_ARGUMENT a BadRequest with one field violation;
- on a retryable UNAVAILABLE (the error's `retry_after_s` is set) a RetryInfo.
A status relayed from another device (RemoteError) keeps the details that device sent.

Whatever a request held, a status stays small: its message is cut at MESSAGE_MAX characters and
each metadata value at QUOTE_MAX (raise sites quote inputs with errors.quote; the cut here is
the last line of defence, so no status can exceed grpc's metadata limit). Two failures happen
outside any handler and are caught here too (`GuardInterceptor`, installed on every server): a
body that does not decode is INVALID_ARGUMENT (reason MALFORMED_REQUEST), and an exception that
is no EmulatorError (a bug of ours) is logged with its traceback and answered INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cmemu.emulator.client import status as client_status
from cmemu.emulator.client.errors import status_in
from cmemu.emulator.client.status import MESSAGE_MAX
from cmemu.emulator.model.errors import (
    QUOTE_MAX,
    EmulatorError,
    InternalError,
    InvalidArgumentError,
    error_line,
    shorten,
)


def status_of(error: EmulatorError) -> grpc.StatusCode:
    """The status of an error (a relayed one keeps its own)."""
    if isinstance(error, RemoteError):
        return error.code
    return client_status.status_of(error)


def code_name(error: EmulatorError) -> str:
    """The name of the status an error reports: a relayed one's own, one a typed client read
    back its status's (UNIMPLEMENTED included), else its class's."""
    if isinstance(error, RemoteError):
        return error.code.name
    return client_status.code_name(error)


def status_line(exc: BaseException) -> str:
    """An error as one status line (`CODE: message`), whether a server or this process raised
    it: for notes and logs that must say what went wrong without a traceback."""
    if isinstance(exc, RemoteError):
        return f"{exc.code.name}: {exc}"
    return error_line(exc)


def details_of(error: EmulatorError) -> list[any_pb2.Any]:
    """The google.rpc details of an error (a relayed one keeps its own)."""
    if isinstance(error, RemoteError):
        return list(error.details)
    return client_status.details_of(error)


def to_status(error: EmulatorError, message: str | None = None) -> grpc.Status:
    """The grpc.Status (code, message, details trailer) that reports `error`."""
    if not isinstance(error, RemoteError):
        return client_status.to_status(error, message)
    return rpc_status.to_status(
        status_pb2.Status(
            code=error.code.value[0],
            message=shorten(str(error) if message is None else message, MESSAGE_MAX),
            details=list(error.details),
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
        super().__init__(shorten(details, MESSAGE_MAX), reason=_reason_in(self.details))

    def prefixed(self, prefix: str) -> RemoteError:
        """The same status, its message prefixed with who relayed it ("n00-npu3: ...")."""
        return RemoteError(self.code, f"{prefix}: {self}", self.details)

    @classmethod
    def from_error(cls, error: EmulatorError, prefix: str) -> RemoteError:
        """An error of a peer (one in this process, or a remote one a typed client read back
        from its status: its code kept, UNIMPLEMENTED included), as the status it sent."""
        code = grpc.StatusCode[code_name(error)]
        return cls(code, f"{prefix}: {error}", details_of(error))


def _reason_in(details: Iterable[any_pb2.Any]) -> str | None:
    for detail in details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason or None
    return None


Context = grpc.aio.ServicerContext[Any, Any]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
T = TypeVar("T")

log = structlog.get_logger("cmemu.rpc")


async def abort(context: Context, error: EmulatorError) -> NoReturn:
    """End an RPC with the status of `error`, details included (for handlers not under `rpc`)."""
    # grpc-stubs lacks the aio context's abort_with_status; it raises, like abort
    await cast(Any, context).abort_with_status(to_status(error))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


def internal(exc: BaseException, *, rpc: str, device: str | None = None) -> InternalError:
    """Log an unexpected exception with its traceback; the short error its caller receives."""
    log.error(
        "internal error",
        device=device,
        rpc=rpc,
        error=shorten(f"{type(exc).__name__}: {exc}", QUOTE_MAX),
        exc_info=exc,
    )
    return InternalError(f"internal error in {rpc} ({type(exc).__name__}); see the server log")


REPEAT_WALL_S = 10.0  # the same rejection is logged at most once this often (wall seconds)
_REPEATS_MAX = 4096  # distinct rejections remembered; past it, the memory starts over


class Repeats:
    """The same rejection (device, RPC, status, reason) logged once per `period_s` of wall time,
    with the count of those left out since: a caller that probes a down device many times a
    second (EMS's pool sweep, ~27 GetFaultState a second while a pool is down) must not flood
    the log with one line each. Wall time, because a log is read on the wall clock."""

    def __init__(
        self, period_s: float = REPEAT_WALL_S, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.period_s = period_s
        self.now = now
        self.seen: dict[tuple[object, ...], tuple[float, int]] = {}

    def admit(self, key: tuple[object, ...]) -> int | None:
        """None: leave this one out; else log it, with this many left out since the last."""
        t = self.now()
        entry = self.seen.get(key)
        if entry is not None and t - entry[0] < self.period_s:
            self.seen[key] = (entry[0], entry[1] + 1)
            return None
        if len(self.seen) >= _REPEATS_MAX:
            self.seen.clear()
        self.seen[key] = (t, 0)
        return entry[1] if entry is not None else 0


REJECTIONS = Repeats()


def rpc(handler: F) -> F:
    """Turn EmulatorErrors raised by a handler into the status of STATUS_OF, with details; any
    other exception is logged with its traceback and answered INTERNAL."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Context) -> Any:
        # a device's engine, or a service's state or servicer (its name)
        state = getattr(self, "engine", None) or getattr(self, "state", None) or self
        admit = getattr(state, "admit", None)  # a device's fault gate (crash, hang)
        try:
            # an open gate (neither crashed nor hung: not `silent`) admits at once: not awaited
            if admit is not None and getattr(state, "silent", True):
                await admit(handler.__name__)
            return await handler(self, request, context)
        except RemoteError as exc:
            await abort(context, exc)
        except EmulatorError as exc:
            device = _device_of(state)
            code = status_of(exc)
            left_out = REJECTIONS.admit((device, handler.__qualname__, code.name, exc.reason))
            if left_out is not None:
                log.info(
                    "rejected",
                    device=device,
                    rpc=handler.__qualname__,
                    code=code.name,
                    reason=exc.reason,
                    error=shorten(str(exc), QUOTE_MAX),
                    **({"repeated": left_out} if left_out else {}),
                )
            await abort(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug of ours: logged, and the caller gets INTERNAL
            device = _device_of(state)
            await abort(context, internal(exc, rpc=handler.__qualname__, device=device))

    return cast(F, wrapper)


def _device_of(state: object) -> str | None:
    """Whom a rejection names: a device engine's device id, else a service's name (found only
    when a call fails, never on the way of one that succeeds)."""
    return getattr(getattr(state, "device", None), "id", getattr(state, "name", None))


class MalformedRequest:
    """What a request deserializer returns for a body that does not decode (never raised:
    grpc answers an exception in a deserializer UNKNOWN before any handler runs)."""

    def __init__(self, error: Exception) -> None:
        self.error = InvalidArgumentError(
            f"the request body does not decode: {shorten(error, QUOTE_MAX)}",
            reason="MALFORMED_REQUEST",
        )


def _safe(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def safe(body: bytes) -> Any:
        try:
            return deserialize(body)
        except Exception as exc:  # DecodeError, or a str field with invalid UTF-8
            return MalformedRequest(exc)

    return safe


if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:  # generic in grpc-stubs only
    _ServerInterceptor = grpc.aio.ServerInterceptor
    _Handler = grpc.RpcMethodHandler


_GUARDED_MAX = 16384  # guarded handlers kept (every method of every server of a process)


class GuardInterceptor(_ServerInterceptor):
    """On every server: corrupt bodies become INVALID_ARGUMENT (a unary request, or any message
    of a client stream), and any exception a handler lets through (one not under `rpc`, a
    stream) is logged and answered INTERNAL. Each method's guarded handler is made once and
    kept (holding the handler, so its id names it): not one handler and closure per call."""

    def __init__(self) -> None:
        self._guarded: dict[tuple[int, str], tuple[_Handler, _Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        key = (id(handler), method)
        held = self._guarded.get(key)
        if held is not None and held[0] is handler:
            return held[1]
        if len(self._guarded) >= _GUARDED_MAX:  # servers come and go (tests start thousands)
            self._guarded.clear()
        guarded = _guard(handler, method)
        self._guarded[key] = (handler, guarded)
        return guarded


def _guard(handler: _Handler, method: str) -> _Handler:
    """`handler` (of `method`) as GuardInterceptor serves it."""
    deserializer = _safe(handler.request_deserializer)
    if handler.request_streaming:
        return _guard_client_stream(handler, deserializer, method)
    if handler.unary_unary is not None:
        unary = cast(Callable[[Any, Context], Awaitable[Any]], handler.unary_unary)

        async def unary_unary(request: Any, context: Context) -> Any:
            if isinstance(request, MalformedRequest):
                await abort(context, request.error)
            try:
                return await unary(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort(context, internal(exc, rpc=method))

        return grpc.unary_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        stream = cast(Callable[[Any, Context], Any], handler.unary_stream)

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, MalformedRequest):
                await abort(context, request.error)
            try:
                produced = stream(request, context)
                if hasattr(produced, "__aiter__"):
                    async for item in produced:
                        yield item
                else:  # a handler that writes with context.write (grpc health's Watch)
                    await produced
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort(context, internal(exc, rpc=method))

        return grpc.unary_stream_rpc_method_handler(
            unary_stream,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A client stream's messages; one that does not decode raises its INVALID_ARGUMENT error,
    for the handler's own task to end the call with. Never aborted here: a handler may read
    its stream in a task of its own (SyncClock), and a status sent from that task while the
    handler's task sends a message raced it (the caller then waited for a status never sent)."""
    async for request in requests:
        if isinstance(request, MalformedRequest):
            raise request.error
        yield request


async def while_reading(reader: asyncio.Task[None], items: AsyncIterator[T]) -> AsyncIterator[T]:
    """`items`, ended by the exception of `reader` (a task reading the call's client stream) as
    soon as it fails, so that the handler's task, the only one that writes to the call, ends it."""
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(items))
            if not reader.done():
                await asyncio.wait({step, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise cast(BaseException, reader.exception())
            try:
                item = await step
            except StopAsyncIteration:
                return
            yield item
    finally:
        if step is not None:
            step.cancel()


def _guard_client_stream(
    handler: _Handler, deserializer: Callable[[bytes], Any] | None, method: str
) -> _Handler:
    """`GuardInterceptor` for a request-streaming method (Ems/PutStream, Fabric/SyncClock):
    each message is checked as it is read, and an exception let through is INTERNAL."""
    if handler.stream_unary is not None:
        unary = cast(Callable[[Any, Context], Awaitable[Any]], handler.stream_unary)

        async def stream_unary(requests: AsyncIterator[Any], context: Context) -> Any:
            try:
                return await unary(_checked(requests), context)
            except grpc.aio.AbortError:
                raise
            except EmulatorError as exc:  # a malformed message, read outside any `rpc` handler
                await abort(context, exc)
            except Exception as exc:
                await abort(context, internal(exc, rpc=method))

        return grpc.stream_unary_rpc_method_handler(
            stream_unary,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.stream_stream is not None:
        stream = cast(Callable[[Any, Context], AsyncIterator[Any]], handler.stream_stream)

        async def stream_stream(
            requests: AsyncIterator[Any], context: Context
        ) -> AsyncIterator[Any]:
            try:
                async for item in stream(_checked(requests), context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except EmulatorError as exc:  # a malformed message, read outside any `rpc` handler
                await abort(context, exc)
            except Exception as exc:
                await abort(context, internal(exc, rpc=method))

        return grpc.stream_stream_rpc_method_handler(
            stream_stream,
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


GUARD = GuardInterceptor()
