"""cmemu-probe, the standard-library gRPC health check of container healthchecks, against real
servers: it must agree with `cmemu probe` (grpcio) on SERVING, NOT_SERVING, an unknown service
and an address where nothing listens."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from cmemu.emulator.client import h2probe
from cmemu.emulator.client.faults import inject
from cmemu.emulator.testing import free_port_block, running_supernode

PROBE = [sys.executable, "-I", "-m", "cmemu.emulator.client.h2probe"]


async def test_it_reads_serving_and_not_serving_as_grpc_does() -> None:
    async with running_supernode("cm-mini") as sn:
        address = sn.address("n00-npu0")
        # a blocking client, as in a container: off the loop that runs the servers
        assert await asyncio.to_thread(h2probe.check, address) == 1
        await inject(sn.clients, "device-down", "n00-npu0")
        assert await asyncio.to_thread(h2probe.check, address) == 2  # NOT_SERVING
        main = h2probe.main
        assert await asyncio.to_thread(main, [address]) == h2probe.NOT_SERVING_EXIT
        assert await asyncio.to_thread(main, [sn.address("n00-npu1")]) == 0
        unknown = [sn.address("n00-npu1"), "no.such.Service"]
        assert await asyncio.to_thread(main, unknown) == h2probe.NOT_SERVING_EXIT


def test_nothing_listening_is_unreachable_and_usage_is_checked() -> None:
    port = free_port_block(1)
    done = subprocess.run(
        [*PROBE, f"127.0.0.1:{port}"], capture_output=True, text=True, check=False
    )
    assert done.returncode == h2probe.UNREACHABLE_EXIT and "unreachable" in done.stderr
    assert h2probe.main([]) == 2
    assert h2probe.main(["not-an-address"]) == h2probe.UNREACHABLE_EXIT


def test_the_probe_imports_only_the_standard_library() -> None:
    code = (
        "import sys, cmemu.emulator.client.h2probe; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'google', 'numpy', 'aiohttp', 'structlog') or m.startswith('cmemu.v1')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hpack_lengths_use_the_prefix_and_continuation_bytes() -> None:
    assert h2probe._length(10) == b"\x0a"
    assert h2probe._length(127) == b"\x7f\x00"
    assert h2probe._length(300) == b"\x7f\xad\x01"  # 300 - 127 = 173 = 0xad & 0x7f | 1 << 7
    assert h2probe.status_of(b"\x08\x01") == 1
    assert h2probe.status_of(b"") == 0
