"""The one parser of `host:port` addresses (STYLE 11: one name, one parser).

Every server, client, generator and check of the emulator reads an address here, so that an
IPv6 host is always written in brackets (`[::1]:7000`) and a typo is told as what it is (a
missing port, a port that is not a number or out of range) instead of surfacing later as a
ValueError from `int()` or a bind on the wrong host.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError, quote

PORT_MAX = 65535
ANY_PORT = 0  # a bind's "any free port", where a caller allows it


@dataclass(frozen=True)
class HostPort:
    """An address as host and port; str() is its one spelling (brackets around an IPv6 host)."""

    host: str  # without brackets: "::1", "127.0.0.1", "n00-npu0"
    port: int

    def __str__(self) -> str:
        return join_address(self.host, self.port)


def join_address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, *, what: str = "address", any_port: bool = False) -> HostPort:
    """`HOST:PORT` or `[IPV6]:PORT`; port 1..65535 (or 0 when `any_port`: a bind's free one).
    InvalidArgumentError (field `what`) says what is wrong with it."""

    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{what} {quote(text)}: {why}", field=what, subject=text, reason="BAD_ADDRESS"
        )

    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise bad("an IPv6 host in brackets needs its closing ']'")
        host, rest = text[1:close], text[close + 1 :]
        if not rest.startswith(":"):
            raise bad("missing :PORT after the bracketed host")
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise bad("missing :PORT (expected HOST:PORT)")
        if ":" in host:
            raise bad(f"an IPv6 host goes in brackets: [{host}]:{port}")
    if not host:
        raise bad("missing the host before :PORT")
    if not port.isdigit() or not port.isascii():
        raise bad(f"port {quote(port)} is not a number")
    number = int(port)
    low = ANY_PORT if any_port else 1
    if not low <= number <= PORT_MAX:
        raise bad(f"port {number} is out of {low}..{PORT_MAX}")
    return HostPort(host, number)


def host_of(address: str) -> str:
    """The host of an address this emulator made or already checked (no brackets)."""
    return parse_address(address, any_port=True).host


def port_of(address: str) -> int:
    """The port of an address this emulator made or already checked."""
    return parse_address(address, any_port=True).port
