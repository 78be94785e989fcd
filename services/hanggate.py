"""The gate of a device's server: a `hang` fault holds every call, a service-slow fault delays it,
a killed service refuses it, while the management methods keep answering (services/rpc.py
holds the other interceptor, GUARD)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc

from cmemu.services.rpc import Context, _Handler, _ServerInterceptor

MANAGEMENT_PREFIX = "/cmemu.v1.Device/"


@functools.cache
def _full_names(methods: frozenset[str]) -> frozenset[str]:
    """The Device methods' full names, made once and shared by every gate that exempts the
    same methods (cm384: 629 gates, each with its own set of the same five strings before)."""
    return frozenset(f"{MANAGEMENT_PREFIX}{m}" for m in methods)


class HangGate(_ServerInterceptor):
    """One per device server: while `answering` is clear (a `hang` fault) every call is
    accepted and never answered, the health Check and Watch included (a heartbeat's deadline
    is how a hung device is found), until the fault clears and the calls proceed. The Device
    service's fault methods (`exempt`) keep answering: the out-of-band management path. With a
    `delay` (a service-slow fault: an emulated-time sleep) every call waits it out first. While
    `refusing` says why, every call is refused UNAVAILABLE at once (a service killed whose server
    must keep answering its `exempt` calls: the fabric, which also tells the emulator's time)."""

    def __init__(self, exempt: frozenset[str] = frozenset()) -> None:
        self.answering = asyncio.Event()
        self.answering.set()
        self.exempt = _full_names(exempt)
        self.delay: Callable[[], Awaitable[None]] | None = None
        self.refusing = ""

    def exempt_methods(self, methods: frozenset[str]) -> None:
        """Full method names (`/cmemu.v1.Fabric/GetClock`) that every state lets through."""
        self.exempt |= methods

    async def _held(self, context: Context) -> None:
        if self.refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.refusing)
        await self.answering.wait()
        delay = self.delay
        if delay is not None:
            await delay()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        handler = await continuation(handler_call_details)
        if (
            (self.answering.is_set() and self.delay is None and not self.refusing)
            or handler is None
            or handler_call_details.method in self.exempt
            or handler.request_streaming
        ):
            return handler
        held = self._held
        if handler.unary_unary is not None:
            unary = cast(Callable[[Any, Context], Awaitable[Any]], handler.unary_unary)

            async def unary_unary(request: Any, context: Context) -> Any:
                await held(context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            stream = cast(Callable[[Any, Context], Any], handler.unary_stream)

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                await held(context)
                produced = stream(request, context)
                if hasattr(produced, "__aiter__"):
                    async for item in produced:
                        yield item
                else:
                    await produced

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
