"""A rejection repeated many times a second (EMS probing a down pool: ~27 GetFaultState a second)
is logged once per REPEAT_WALL_S with the count left out, not once each; a different rejection
is still logged at once."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog

from cmemu.emulator.model.errors import NotFoundError, UnavailableError
from cmemu.services import rpc as rpc_module
from cmemu.services.rpc import Repeats, rpc


class _Aborted(Exception):
    pass


class _Context:
    async def abort_with_status(self, _: object) -> None:
        raise _Aborted


class _Pool:
    name = "n00-mem0"
    error: Exception = UnavailableError("the device is down", reason="DEVICE_FAULTED")

    @rpc
    async def GetFaultState(self, request: Any, context: Any) -> None:
        raise self.error


class _Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


async def _call(pool: _Pool, times: int) -> None:
    for _ in range(times):
        with pytest.raises(_Aborted):
            await pool.GetFaultState(None, _Context())


def _rejected(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "rejected"]


async def test_a_repeated_rejection_is_logged_once_per_period_with_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(rpc_module, "REJECTIONS", Repeats(period_s=10.0, now=clock))
    pool = _Pool()
    with structlog.testing.capture_logs() as logs:
        await _call(pool, 27)  # a second of EMS's sweep against a down pool
        clock.t += 9.9
        await _call(pool, 27 * 9)
    (line,) = _rejected(logs)
    assert line["device"] == "n00-mem0" and line["reason"] == "DEVICE_FAULTED"
    assert "repeated" not in line
    with structlog.testing.capture_logs() as logs:
        clock.t += 0.2  # the period is over: one line, saying how many were left out
        await _call(pool, 27)
    (line,) = _rejected(logs)
    assert line["repeated"] == 27 * 10 - 1


async def test_a_different_rejection_is_logged_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc_module, "REJECTIONS", Repeats(period_s=10.0, now=_Clock()))
    pool = _Pool()
    with structlog.testing.capture_logs() as logs:
        await _call(pool, 5)
        pool.error = NotFoundError("no such region", reason="REGION_NOT_FOUND")
        await _call(pool, 5)
    assert [e["reason"] for e in _rejected(logs)] == ["DEVICE_FAULTED", "REGION_NOT_FOUND"]


def test_the_memory_of_rejections_is_bounded() -> None:
    repeats = Repeats(period_s=10.0, now=_Clock())
    for n in range(rpc_module._REPEATS_MAX + 10):
        assert repeats.admit((n,)) == 0
    assert len(repeats.seen) <= rpc_module._REPEATS_MAX
