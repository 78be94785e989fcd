"""One server's method table: every method of every service it serves in one dictionary.

What the generated `add_*Servicer_to_server` functions see of a server (`MethodTable`): each
registers its method handlers twice, as a generic handler and as "registered methods". A
grpc.aio server keeps one call requested in advance per registered method (a task, a future and
a core call each: cm384's 629 servers held 12,000 of them, about 40 MB and a quarter of a second
of start), where a server with only generic handlers keeps one for all; so the registered ones
are taken here into one generic handler. Their method names, `/package.Service/Method`, are one
string each for every server of the process, where grpc's own generic handlers built a string,
a handler and a dictionary per service per server (cm384: 12,500 strings, about 2 MB, issue 18).
The methods, their handlers and the interceptors are the same either way: grpc dispatches a call
by its method name in a dictionary."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    _Generic = grpc.GenericRpcHandler[Any, Any]
else:  # generic in grpc-stubs only
    Handler = grpc.RpcMethodHandler
    _Generic = grpc.GenericRpcHandler


@cache
def method_name(service: str, method: str) -> str:
    """`/service/method`, one string for every server of the process."""
    return f"/{service}/{method}"


class _Methods(_Generic):
    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        return self.handlers.get(handler_call_details.method)


class MethodTable:
    """Collects a server's services as the generated code registers them; `install` adds them
    to the server as one generic handler (and any generic handler that came without its
    registered methods, as it came)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self._methods = _Methods()
        self._generic: dict[str | None, list[_Generic]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[_Generic]) -> None:
        """Kept until the same service's registered methods come (the generated code sends
        them next) and replace it."""
        for handler in handlers:
            name = handler.service_name() if isinstance(handler, grpc.ServiceRpcHandler) else None
            self._generic.setdefault(name, []).append(handler)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        self._generic.pop(service, None)
        for method, handler in handlers.items():
            self._methods.handlers[method_name(service, method)] = handler

    def install(self) -> None:
        left = [h for handlers in self._generic.values() for h in handlers]
        self._server.add_generic_rpc_handlers((self._methods, *left))
