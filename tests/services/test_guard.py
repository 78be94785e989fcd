"""GUARD (services/rpc.py) makes each method's guarded handler once: the same handler comes back
for every call of a method, not a handler and two closures per call (the UB hot path paid
that); the twin: another server's handler of the same method gets its own guarded handler, so
a call never reaches the wrong server's servicer."""

from __future__ import annotations

from typing import Any

import grpc

from cmemu.services.rpc import GuardInterceptor


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _handler(answer: str) -> Any:
    async def unary(request: Any, context: Any) -> str:
        return answer

    return grpc.unary_unary_rpc_method_handler(unary)


def _continuation(handler: Any) -> Any:
    async def continuation(details: grpc.HandlerCallDetails) -> Any:
        return handler

    return continuation


async def test_each_methods_guarded_handler_is_made_once() -> None:
    guard, handler = GuardInterceptor(), _handler("a")
    first: Any = await guard.intercept_service(_continuation(handler), _Details("/x.S/M"))
    again: Any = await guard.intercept_service(_continuation(handler), _Details("/x.S/M"))
    assert again is first and first is not handler
    assert await first.unary_unary(None, None) == "a"


async def test_another_servers_handler_of_the_same_method_is_guarded_apart() -> None:
    guard = GuardInterceptor()
    a: Any = await guard.intercept_service(_continuation(_handler("a")), _Details("/x.S/M"))
    b: Any = await guard.intercept_service(_continuation(_handler("b")), _Details("/x.S/M"))
    assert a is not b
    assert await a.unary_unary(None, None) == "a"
    assert await b.unary_unary(None, None) == "b"
