"""What a client presents to an emulator: its bearer token and the CA it verifies servers with.

One `Credentials` value opens every channel (cmemu.emulator.client.channels), so typed clients,
health checks and devices calling each other (cmemu.services.peers) carry the same token and
trust the same CA. The token goes as `authorization: Bearer <token>` metadata on every call, by
a client interceptor (call credentials would need TLS; the token is wanted over plaintext
loopback too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

AUTH_HEADER = "authorization"
ChannelOptions = Sequence[tuple[str, Any]]

if TYPE_CHECKING:  # generic in the stubs only
    _UnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _StreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor[Any, Any]
    _StreamStreamBase = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor
    _StreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor
    _StreamStreamBase = grpc.aio.StreamStreamClientInterceptor


def _with_token(details: grpc.aio.ClientCallDetails, value: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata[AUTH_HEADER] = value
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _UnaryUnary(_UnaryUnaryBase):
    def __init__(self, value: str) -> None:
        self.value = value

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.value), request)


class _UnaryStream(_UnaryStreamBase):
    def __init__(self, value: str) -> None:
        self.value = value

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.value), request)


class _StreamUnary(_StreamUnaryBase):
    def __init__(self, value: str) -> None:
        self.value = value

    async def intercept_stream_unary(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_with_token(details, self.value), request_iterator)


class _StreamStream(_StreamStreamBase):
    def __init__(self, value: str) -> None:
        self.value = value

    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_with_token(details, self.value), request_iterator)


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """A bearer token (None: send none) and the PEM of the CA that signed the servers'
    certificates (None: plaintext)."""

    token: str | None = field(default=None, repr=False)
    ca_pem: bytes | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.ca_pem is not None

    def interceptors(self) -> list[Any]:
        """One interceptor per call shape (grpc.aio files each under one shape only)."""
        if not self.token:
            return []
        value = f"Bearer {self.token}"
        return [_UnaryUnary(value), _UnaryStream(value), _StreamUnary(value), _StreamStream(value)]

    def channel(self, address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
        """A channel to `address` that presents the token and verifies the server's
        certificate against the CA."""
        interceptors = self.interceptors() or None
        if self.ca_pem is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(
            address,
            grpc.ssl_channel_credentials(root_certificates=self.ca_pem),
            options=options,
            interceptors=interceptors,
        )


ANONYMOUS = Credentials()
