"""Every error the endpoint answers is OpenAI's error JSON: `{"error": {"message", "type",
"param", "code"}}`, with `Retry-After` (wall seconds) where asking again later can succeed.
Domain errors map through one table, as the gRPC services' do through services/rpc.py."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cmemu.emulator.model.errors import (
    CapacityError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.tenants import QuotaExceededError, RateLimitedError

if TYPE_CHECKING:  # imported by `response`: the admission raises these at every boot's import
    from aiohttp import web

    from cmemu.emulator.model.serving.engine import FinishEvent  # the serving model's, 20 ms

STATUS: tuple[tuple[type[EmulatorError], int, str, str | None], ...] = (
    (InvalidArgumentError, 400, "invalid_request_error", None),
    (OutOfRangeError, 400, "invalid_request_error", None),
    (NotFoundError, 404, "not_found_error", None),
    (UnavailableError, 503, "service_unavailable", None),
    (QuotaExceededError, 429, "insufficient_quota", "insufficient_quota"),
    (RateLimitedError, 429, "rate_limit_error", "rate_limit_exceeded"),
    (CapacityError, 429, "rate_limit_error", "rate_limit_exceeded"),
    (PreconditionError, 409, "conflict_error", None),
)


class HttpError(Exception):
    """An answer other than 200, as OpenAI shapes it."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def response(self) -> web.Response:
        """The answer (aiohttp's, imported here: the endpoint serves by now)."""
        from aiohttp import web

        body = {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        headers = {}
        if self.retry_after_s is not None and math.isfinite(self.retry_after_s):
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return web.json_response(body, status=self.status, headers=headers)


def bad(message: str, param: str | None = None, *, code: str | None = None) -> HttpError:
    return HttpError(400, message, "invalid_request_error", param, code=code)


def too_large(message: str, param: str | None = None) -> HttpError:
    return HttpError(413, message, "invalid_request_error", param, code="request_too_large")


def from_domain(exc: EmulatorError, wall_s: float | None = None) -> HttpError:
    """The HTTP answer to a domain error; `wall_s` converts its emulated retry hint (None: the
    hint is in wall seconds already)."""
    retry = exc.retry_after_s
    if retry is not None and wall_s is not None:
        retry = wall_s
    for cls, status, kind, code in STATUS:
        if isinstance(exc, cls):
            return HttpError(
                status, str(exc), kind, exc.field, code=code or exc.reason.lower(),
                retry_after_s=retry,
            )  # fmt: skip
    return HttpError(500, str(exc), "server_error", code=exc.reason.lower())


def failed_error(event: FinishEvent) -> dict[str, Any]:
    """The OpenAI error object of a request that failed (ERROR)."""
    return {
        "message": f"the request failed: {event.error}",
        "type": "service_unavailable",
        "param": None,
        "code": "request_failed",
    }
