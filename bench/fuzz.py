"""Fuzz benchmark: the suite's fuzzing (tests/fuzz) for longer, against cm-mini in this process.

Random and boundary messages to every method of Device, UnifiedBus, Npu, Cpu, MemoryPool and
Fabric, and corrupt bodies, round-robin, for --seconds of wall time. Prints the calls made, the
statuses by code, calls per second, and every call that broke a property (UNKNOWN, INTERNAL,
DEADLINE_EXCEEDED, a wrong well-formed answer, a server not SERVING, an acknowledged byte
changed); writes the figures to bench/results/fuzz.json and fuzz.png (calls by status).

    python bench/fuzz.py [--seconds 60] [--results DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cmemu.emulator.runtime.logs import configure_logging  # noqa: E402
from tests.fuzz import test_fuzz as suite  # noqa: E402
from tests.fuzz.harness import corrupt_bodies, fuzz_target, methods  # noqa: E402

try:
    from bench import outputs, progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]


def run(seconds: float) -> dict[str, object]:
    failures: list[str] = []
    with fuzz_target(suite.PROFILE) as target:
        world = suite._setup(target)
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        services = sorted(suite.SERVICES)

        @settings(
            max_examples=200,
            deadline=None,
            phases=[Phase.generate],
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def one(data: st.DataObject) -> None:
            service = data.draw(st.sampled_from(services))
            svc, servers = suite.SERVICES[service]
            corrupt = data.draw(st.integers(0, 9)) == 0
            if corrupt:
                method = data.draw(st.sampled_from(methods(svc)))
                body = data.draw(corrupt_bodies())
            else:
                method_name, request = data.draw(suite._strategy(world.hints, service))
            if time.perf_counter() > stop_at:  # every draw made: hypothesis wants them alike
                return
            if corrupt:
                code, reply = target.call(
                    servers[0], service, method.name, body, stream=method.server_streaming
                )
                if code.name not in ("OK", "INVALID_ARGUMENT"):
                    failures.append(f"corrupt {method.name}: {code.name} {str(reply)[:200]}")
                return
            try:
                suite._fuzz(world, service, method_name, request, servers)
            except AssertionError as exc:
                failures.append(str(exc)[:500])

        with progress.steps("fuzzing cm-mini (seconds)", total=round(seconds)) as advance:
            shown = 0
            while time.perf_counter() < stop_at:
                one()  # a batch of examples; a new seed each time
                now = min(round(time.perf_counter() - started), round(seconds))
                advance(now - shown)
                shown = now
        wall = time.perf_counter() - started
        try:
            suite.test_everything_serving_and_every_acknowledged_byte_kept(world)
            final = "ok"
        except AssertionError as exc:
            final = f"FAILED: {exc}"
        return {
            "seconds": round(wall, 1),
            "calls": target.calls,
            "calls_per_s": round(target.calls / wall, 1),
            "statuses": dict(target.codes.most_common()),
            "failures": failures[:50],
            "failure_count": len(failures),
            "serving_and_bytes_kept": final,
        }


def plot(figures: dict[str, object], directory: Path) -> None:
    statuses = figures["statuses"]
    assert isinstance(statuses, dict)
    with outputs.figure(directory, "fuzz", size=(8, 4.5)) as (ax,):
        outputs.bars(
            ax,
            list(statuses),
            {"calls": list(statuses.values())},
            ylabel="calls (log)",
            title=f"fuzzing cm-mini: {figures['calls']:,} calls in {figures['seconds']} s, "
            f"{figures['failure_count']} property failures",
            log=True,
            value_format="%d",
        )
        ax.tick_params(axis="x", labelrotation=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    configure_logging("error")  # rejections are the point here: only errors are news
    figures = run(args.seconds)
    print(f"calls: {figures['calls']} in {figures['seconds']} s ({figures['calls_per_s']}/s)")
    print("statuses:", ", ".join(f"{k} {v}" for k, v in figures["statuses"].items()))  # type: ignore[attr-defined]
    print(f"property failures: {figures['failure_count']}")
    for failure in figures["failures"]:  # type: ignore[attr-defined]
        print("  ", failure)
    print("afterwards:", figures["serving_and_bytes_kept"])
    outputs.write_json(args.results, "fuzz", figures)
    plot(figures, args.results)
    outputs.announce(args.results, "fuzz")


if __name__ == "__main__":
    main()
