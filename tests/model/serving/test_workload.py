"""Workloads as data and the Mooncake trace reader, good and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.serving.workload import generate, parse_workload, read_mooncake

ROOT = Path(__file__).resolve().parents[3]


def test_generation_is_deterministic_and_follows_the_distributions() -> None:
    w = parse_workload(
        {
            "input": {"kind": "uniform", "low": 600, "high": 5000},
            "output": 100,
            "rate_per_s": 50,
            "duration_s": 20,
            "seed": 3,
            "prefix_reuse": 0.5,
        }
    )
    a, b = list(generate(w, block_tokens=512)), list(generate(w, block_tokens=512))
    assert a == b
    assert a != list(generate(w, block_tokens=512, seed=4))
    assert 700 < len(a) < 1300  # Poisson at 50/s for 20 s
    assert all(600 <= r.input_tokens <= 5000 and r.output_tokens == 100 for r in a)
    assert all(len(r.block_keys) == r.input_tokens // 512 for r in a)
    times = [r.arrival_s for r in a]
    assert times == sorted(times) and times[-1] < 20
    shared = sum(k.startswith("p") for r in a for k in r.block_keys)
    assert shared / sum(len(r.block_keys) for r in a) == pytest.approx(0.5, abs=0.05)


def test_a_fixed_number_of_requests_at_a_constant_rate() -> None:
    w = parse_workload({"arrival": "constant", "rate_per_s": 4, "requests": 5, "input": 100})
    got = list(generate(w, block_tokens=512))
    assert [r.arrival_s for r in got] == [0, 0.25, 0.5, 0.75, 1.0]
    assert all(r.block_keys == () for r in got)


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 2},
        {"colour": "red"},
        {"input": {"kind": "zipf"}},
        {"input": {"kind": "uniform", "low": 10, "high": 5}},
        {"input": {"kind": "constant", "value": 10, "min": 0}},
        {"input": "long"},
        {"output": {"kind": "normal", "mean": 10, "sigma": -1}},
        {"arrival": "bursty"},
        {"rate_per_s": 0},
        {"rate_per_s": "fast"},
        {"prefix_reuse": 1.5},
        {"requests": 2.5},
        {"duration_s": -1},
        {"seed": True},
        [],
    ],
)
def test_bad_workloads_are_refused(doc: object) -> None:
    with pytest.raises((InvalidArgumentError, NotFoundError)):
        parse_workload(doc)  # type: ignore[arg-type]


def test_the_mooncake_trace_reads() -> None:
    lines = (ROOT / "workloads/mooncake-synthetic.jsonl").read_text().splitlines()
    requests = read_mooncake(lines, block_tokens=512)
    assert len(requests) == 3993
    first = json.loads(lines[0])
    r = requests[0]
    assert r.arrival_s == first["timestamp"] / 1000
    assert r.input_tokens == first["input_length"] and r.output_tokens == first["output_length"]
    # only full blocks become keys: the trace names the last partial block too
    assert r.block_keys == tuple(str(i) for i in first["hash_ids"][: r.input_tokens // 512])
    assert [x.arrival_s for x in requests] == sorted(x.arrival_s for x in requests)
    shared = {k for x in requests for k in x.block_keys}
    assert len(shared) < sum(len(x.block_keys) for x in requests)  # prefixes are reused


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"timestamp": 0, "input_length": 10}', "missing"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1}', "timestamp >= 0"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}', "lengths >= 1"),
        ('{"timestamp": 0, "input_length": 9.5, "output_length": 1}', "whole number"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
        ('{"timestamp": "soon", "input_length": 10, "output_length": 1}', "number"),
    ],
)
def test_bad_trace_lines_name_their_line(line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}'
    with pytest.raises(InvalidArgumentError, match=message) as info:
        read_mooncake([good, "", line], block_tokens=512)
    assert "line 3" in str(info.value)
