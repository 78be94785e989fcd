"""Issue 21 finding 11 beyond the OpenAI endpoint: the web view bound beyond loopback without a
token is refused before anything starts (unless --insecure), as every server is; /metrics closes
connections that never speak."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cmemu.emulator.runtime.metrics import Families
from cmemu.emulator.runtime.metricserver import MetricsServer
from cmemu.emulator.testing import free_port_block, run_cmemu


def test_the_web_view_beyond_loopback_wants_a_token(tmp_path: Path) -> None:
    state = ("--state-file", str(tmp_path / "s.json"), "--preset", "cm-mini", "--broker", "none")
    refused = run_cmemu("up", "--ui", "0.0.0.0:0", *state)
    assert refused.returncode == 1
    assert "INSECURE_BIND" in refused.stderr and "the web view" in refused.stderr
    assert not (tmp_path / "s.json").exists()  # nothing started


def _nothing() -> Families:
    return Families()


async def test_metrics_close_silent_connections() -> None:
    port = free_port_block(1)
    server = MetricsServer(
        address=f"127.0.0.1:{port}", name="test /metrics", read=_nothing, idle_s=0.5
    )
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(30):  # closed after about half a second
            assert await reader.read() == b""
        writer.close()
