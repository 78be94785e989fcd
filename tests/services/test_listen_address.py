"""Where a server listens (services/host.py listen_address): a container's name binds every
interface, so that a container reconnected to its network at another address still answers
there (the engine test's container-disconnect: its peers were refused until it restarted);
an address that is already where to listen stays itself, and loopback is never widened."""

from __future__ import annotations

import pytest

from cmemu.services.host import listen_address


@pytest.mark.parametrize(
    ("address", "listens"),
    [
        ("n00-npu5:50051", "[::]:50051"),  # a container's or a pod's name
        ("ems.cmemu.svc.cluster.local:50051", "[::]:50051"),
        ("127.0.0.1:21000", "127.0.0.1:21000"),  # an address: itself
        ("127.10.0.3:50051", "127.10.0.3:50051"),
        ("[::1]:21000", "[::1]:21000"),
        ("0.0.0.0:50051", "0.0.0.0:50051"),
        ("localhost:21000", "localhost:21000"),  # loopback by name: not widened
        ("unix:/tmp/x.sock", "unix:/tmp/x.sock"),
    ],
)
def test_a_name_listens_everywhere_an_address_where_it_says(address: str, listens: str) -> None:
    assert listen_address(address) == listens
