"""Calls per second of several calls against a base call (a raw gRPC ping), timed in rounds of
short windows taken in turn (ping, op, op, ping, ...), each ratio the median of the rounds' own.

On a shared 2-core host a load that comes or goes moves the windows of one round alike, where
two long windows seconds apart set a ping timed in a quiet moment against an op timed in a busy
one: bench/fabric.py's UB ratio, timed so, read 0.64 to 0.77 in six runs of one tree. Used by
bench/ems.py (Put, Get) and bench/fabric.py (UB Submit)."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Mapping

from cmemu.emulator.testing import calls_per_second

Call = Callable[[], Awaitable[object]]


def summary(rounds: list[dict[str, float]], base: str = "ping") -> dict[str, float]:
    """Each call's median rate over the rounds (calls/s), and each one's ratio to `base` as the
    median of the rounds' own ratios (`NAME_to_BASE`), not the ratio of the medians, which can
    set a ping of a quiet round against an op of a busy one."""
    names = list(rounds[0])
    out = {name: statistics.median(r[name] for r in rounds) for name in names}
    for name in names:
        if name != base:
            out[f"{name}_to_{base}"] = statistics.median(r[name] / r[base] for r in rounds)
    return out


async def timed_rounds(
    calls: Mapping[str, Call], window_s: float, count: int, concurrency: int
) -> list[dict[str, float]]:
    """`count` rounds, each every call's rate over one window of `window_s`, in `calls`' order,
    with `concurrency` calls in flight."""
    rounds = []
    for _ in range(count):
        rates = {}
        for name, call in calls.items():
            rates[name] = await calls_per_second(call, window_s, concurrency)
        rounds.append(rates)
    return rounds


def print_rounds(rounds: list[dict[str, float]], base: str = "ping") -> None:
    """One line per round: every rate, and each one's ratio to `base`."""
    for n, r in enumerate(rounds):
        rates = "  ".join(f"{name} {rate:7,.0f}" for name, rate in r.items())
        ratios = "  ".join(f"{name}/{base} {r[name] / r[base]:.2f}" for name in r if name != base)
        print(f"round {n + 1:<2} {rates}  {ratios}")
