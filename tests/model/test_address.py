"""The one host:port parser: what it accepts, and every bad input told as what it is."""

from __future__ import annotations

import errno
import socket

import pytest

from cmemu.emulator.model.address import (
    HostPort,
    host_of,
    join_address,
    parse_address,
    port_of,
)
from cmemu.emulator.model.errors import AddressInUseError, InvalidArgumentError, bind_error


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:7000", "127.0.0.1", 7000),
        ("n00-npu0:50051", "n00-npu0", 50051),
        ("[::1]:9", "::1", 9),
        ("[::]:65535", "::", 65535),
        ("localhost:1", "localhost", 1),
    ],
)
def test_parses_host_and_port(text: str, host: str, port: int) -> None:
    parsed = parse_address(text)
    assert parsed == HostPort(host, port)
    assert str(parsed) == text  # joined back as written: IPv6 in brackets
    assert (host_of(text), port_of(text)) == (host, port)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "missing :PORT"),
        ("n00-npu0", "missing :PORT"),
        ("n00-npu0:", "port '' is not a number"),
        (":7000", "missing the host"),
        ("host:http", "port 'http' is not a number"),
        ("host:-1", "port '-1' is not a number"),
        ("host:\uff17\uff10", "is not a number"),  # digits, but not ASCII ones
        ("host:0", "port 0 is out of 1..65535"),
        ("host:65536", "port 65536 is out of 1..65535"),
        ("::1:80", "an IPv6 host goes in brackets: [::1]:80"),
        ("[::1]80", "missing :PORT after the bracketed host"),
        ("[::1:80", "closing ']'"),
        ("[]:80", "missing the host"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match="broker_address") as err:
        parse_address(text, what="broker_address")
    assert why in str(err.value)
    assert err.value.field == "broker_address" and err.value.reason == "BAD_ADDRESS"


def test_port_zero_only_where_a_bind_takes_any_port() -> None:
    assert parse_address("127.0.0.1:0", any_port=True) == HostPort("127.0.0.1", 0)
    with pytest.raises(InvalidArgumentError, match=r"out of 1\.\.65535"):
        parse_address("127.0.0.1:0")
    with pytest.raises(InvalidArgumentError, match=r"out of 0\.\.65535"):
        parse_address("127.0.0.1:65536", any_port=True)


def test_join_brackets_ipv6_only() -> None:
    assert join_address("::1", 80) == "[::1]:80"
    assert join_address("127.0.0.1", 80) == "127.0.0.1:80"
    assert parse_address(join_address("fe80::1", 443)).host == "fe80::1"


def test_bind_errors_name_the_host_without_brackets() -> None:
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    said = str(bind_error("the web view", "[fe80::1]:8080", unknown))
    assert "cannot resolve fe80::1 (" in said
    assert isinstance(
        bind_error("the web view", "[::1]:8080", OSError(errno.EADDRINUSE, "in use")),
        AddressInUseError,
    )
