"""What serve-model says before it waits (issue 24 item 6): the load's emulated and wall time at
the running time scale, and, when that is long, a warm start and a time scale that would make it
a minute."""

from __future__ import annotations

from cmemu.emulator.cli.loading import advice, wall
from cmemu.emulator.client.deployments import Deployment, deployment
from cmemu.v1 import router_pb2


def _deployment(source: str) -> Deployment:
    weights = router_pb2.WeightLoading(
        bytes=671_000_000_000, source=source, cold_ns=2240 * 10**9, from_ems_ns=280 * 10**9
    )
    return deployment(router_pb2.Deployment(name="deepseek-r1", weights=weights))


def test_a_long_cold_load_offers_a_warm_start_and_a_time_scale() -> None:
    lines = advice(_deployment("cold"), 1.0, warm=False)
    assert lines[0] == (
        "loading 671 GB of weights cold, from object storage: 2,240 s emulated, "
        "37 min 20 s of wall time at time scale 1"
    )
    assert "serve-model --warm) loads in 280 s emulated, 4 min 40 s wall" in lines[1]
    assert "cmemu up --time-scale 38" in lines[2] and "59 s of wall time" in lines[2]


def test_a_short_load_says_only_how_long() -> None:
    assert advice(_deployment("cold"), 60.0, warm=False) == [
        "loading 671 GB of weights cold, from object storage: 2,240 s emulated, "
        "37 s of wall time at time scale 60"
    ]
    warm = advice(_deployment("ems"), 1.0, warm=True)
    assert warm[0].startswith("loading 671 GB of weights from EMS: 280 s emulated, 4 min 40 s")
    assert not any("--warm" in line for line in warm)  # already warm: the time scale only


def test_wall_times_read_as_people_say_them() -> None:
    assert [wall(s) for s in (0.25, 42, 99.4, 125, 3599, 7260)] == [
        "0.2 s", "42 s", "99 s", "2 min 05 s", "59 min 59 s", "2 h 01 min",
    ]  # fmt: skip
