"""Prometheus metrics: real supernodes, real scrapes over HTTP, parsed by prometheus-client's own
parser; the values follow exactly what was done to the emulator."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.addressplans import METRICS_PORT, LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import AddressInUseError, InvalidArgumentError
from cmemu.emulator.model.instruments import LATENCY_BUCKETS_S, Family, Histogram
from cmemu.emulator.model.topology import ServiceKind, build, metrics_address, server_count
from cmemu.emulator.runtime import exposition
from cmemu.emulator.runtime.launchmodes import InProcess, Procs
from cmemu.emulator.runtime.metrics import Families
from cmemu.emulator.runtime.metricserver import endpoints
from cmemu.emulator.runtime.registry import SERVICE_SPECS
from cmemu.emulator.runtime.supernode import EMBEDDED, NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import cmemu_up, free_port_block, run_cmemu, running_supernode
from cmemu.v1 import device_pb2, ems_pb2, ems_pb2_grpc, fabric_pb2, npu_pb2, ub_pb2

KIB = 1024


async def scrape(url: str, accept: str = "") -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Accept": accept} if accept else {}) as response,
    ):
        assert response.status == 200
        return await response.text()


def parse(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: Mapping[str, Metric], sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` whose labels include `labels`."""
    found = [
        s.value
        for f in families.values()
        for s in f.samples
        if s.name == sample and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, f"{sample}{labels}: {found}"
    return found[0]


def samples(families: Mapping[str, Metric], name: str) -> list[dict[str, str]]:
    return [s.labels for f in families.values() for s in f.samples if s.name == name]


def expected_buckets(latencies_s: list[float]) -> dict[str, float]:
    """Cumulative counts per `le`, as the device must expose them."""
    out = {}
    for bound in LATENCY_BUCKETS_S:
        out[repr(bound)] = float(sum(1 for x in latencies_s if x <= bound))
    out["+Inf"] = float(len(latencies_s))
    return out


def buckets(families: Mapping[str, Metric], name: str, **labels: str) -> dict[str, float]:
    return {
        s.labels["le"]: s.value
        for s in families[name].samples
        if s.name == f"{name}_bucket" and labels.items() <= s.labels.items()
    }


Done = dict[str, list[tuple[int, int]]]  # by op (and "kernel"): (issue_ns, complete_ns)
UB_BYTES = 5 * KIB + 512 + 4 * KIB + 64 * KIB


async def _load(sn: Supernode) -> Done:
    """UB writes and reads from n00-npu0 into n01-npu3, kernels on n00-npu0, EMS puts, hits and
    a miss, a faulted device and a fabric link down."""
    c = sn.clients
    target = await c.device("n01-npu3").AllocateRegion(
        device_pb2.AllocateRegionRequest(size=64 * KIB)
    )
    dst = ub_pb2.UbAddress(eid=target.eid, offset=target.offset)
    bus = c.bus("n00-npu0")
    done: Done = {"write": [], "read": [], "kernel": []}
    for i in range(5):
        tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=bytes([i]) * KIB)
        reply = await bus.Submit(tx)
        done["write"].append((reply.issue_ns, reply.complete_ns))
    for size in (512, 4 * KIB, 64 * KIB):
        tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=size, size_only=True)
        reply = await bus.Submit(tx)
        done["read"].append((reply.issue_ns, reply.complete_ns))
    for i in range(4):
        kernel = npu_pb2.Kernel(
            name=f"k{i}", die=0, flops=1e12, bytes_moved=1 << 20, precision=npu_pb2.PRECISION_BF16
        )
        result = await c.npu("n00-npu0").SubmitKernel(kernel)
        done["kernel"].append((result.issue_ns, result.complete_ns))
    ems = ems_pb2_grpc.EmsStub(c.channel_to(sn.address("ems")))
    for i in range(3):
        await ems.Put(ems_pb2.PutRequest(key=f"obj-{i}", data=b"x" * KIB))
    for i in range(2):
        await ems.Get(ems_pb2.GetRequest(key=f"obj-{i}"))
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await ems.Get(ems_pb2.GetRequest(key="absent"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    await c.device("n01-npu2").SetFaultState(device_pb2.FaultState(faulted=True, reason="t"))
    await c.fabric().InjectFault(
        fabric_pb2.FabricFault(kind="link-down", target="n00-npu5.d0~n00-l1s2")
    )
    return done


def _seconds(done: list[tuple[int, int]]) -> list[float]:
    return [(complete - issue) / 1e9 for issue, complete in done]


def _check_devices(m: dict[str, Metric], done: Done, sn: Supernode) -> None:
    npu0 = {"device": "n00-npu0", "node": "n00", "kind": "npu", "supernode": "sn0"}
    assert value(m, "cmemu_ub_issued_total", **npu0) == 8
    assert value(m, "cmemu_ub_issued_bytes_total", **npu0) == UB_BYTES
    assert value(m, "cmemu_ub_applied_total", device="n01-npu3") == 8
    assert value(m, "cmemu_ub_applied_total", device="n00-npu1") == 0
    for op in ("write", "read"):
        latencies = _seconds(done[op])
        where = {"device": "n00-npu0", "op": op}
        assert value(m, "cmemu_ub_latency_seconds_count", **where) == len(latencies)
        assert value(m, "cmemu_ub_latency_seconds_sum", **where) == pytest.approx(sum(latencies))
        assert buckets(m, "cmemu_ub_latency_seconds", **where) == expected_buckets(latencies)
    assert {s["op"] for s in samples(m, "cmemu_ub_latency_seconds_count")} == {"write", "read"}
    kernels = _seconds(done["kernel"])
    assert value(m, "cmemu_npu_kernel_latency_seconds_count", device="n00-npu0") == 4
    assert value(m, "cmemu_npu_kernel_latency_seconds_sum", device="n00-npu0") == (
        pytest.approx(sum(kernels))
    )
    assert buckets(m, "cmemu_npu_kernel_latency_seconds", device="n00-npu0") == (
        expected_buckets(kernels)
    )
    assert value(m, "cmemu_device_utilization_ratio", device="n00-npu0") > 0
    assert value(m, "cmemu_device_utilization_ratio", device="n00-npu1") == 0
    assert value(m, "cmemu_device_memory_used_bytes", device="n01-npu3") == 64 * KIB
    assert value(m, "cmemu_device_memory_capacity_bytes", device="n01-npu3") == (
        sn.local.devices["n01-npu3"].memory.capacity
    )
    assert value(m, "cmemu_device_regions", device="n01-npu3") == 1
    assert value(m, "cmemu_device_healthy", device="n01-npu2") == 0
    assert value(m, "cmemu_device_faults_total", device="n01-npu2") == 1
    assert value(m, "cmemu_device_healthy", device="n01-npu1") == 1
    healthy = samples(m, "cmemu_device_healthy")
    assert len(healthy) == len(sn.topology.devices)
    assert all({"device", "node", "kind", "supernode"} <= set(s) for s in healthy)
    assert {s["kind"] for s in healthy} == {"npu", "cpu", "mempool"}


def _check_services(m: dict[str, Metric], sn: Supernode) -> None:
    fabric = {"device": "fabric", "kind": "fabric"}
    assert value(m, "cmemu_fabric_faults", fault_kind="link-down", **fabric) == 1
    assert value(m, "cmemu_fabric_links_down", plane="2", link_kind="die-l1") == 2
    assert value(m, "cmemu_fabric_links_down", plane="3", link_kind="die-l1") == 0
    assert value(m, "cmemu_fabric_flows_in_flight", **fabric) == 0
    assert value(m, "cmemu_fabric_flows_completed_total", **fabric) >= 8
    cross = sum(
        value(m, "cmemu_fabric_link_bytes_total", plane=str(p), link_kind="l1-l2") for p in range(7)
    )
    assert cross >= UB_BYTES  # n00 to n01 crosses the L2 tier
    assert value(m, "cmemu_ems_objects", tier="dram", device="ems") == 3
    assert value(m, "cmemu_ems_hits_total") == 2
    assert value(m, "cmemu_ems_misses_total") == 1
    assert value(m, "cmemu_ems_evictions_total") == 0
    assert value(m, "cmemu_ems_pool_healthy", pool="n00-mem") == 1
    assert value(m, "cmemu_process_servers") == len(sn.local.hosted)
    assert value(m, "cmemu_time_scale") == 1
    assert value(m, "cmemu_emulated_seconds") > 0
    assert "process_resident_memory_bytes" in m  # prometheus-client's own process metrics


async def test_scrape_follows_transfers_kernels_ems_and_faults() -> None:
    async with running_supernode("cm-mini") as sn:
        assert sn.local.metrics is not None
        done = await _load(sn)
        m = parse(await scrape(sn.local.metrics.url))
        _check_devices(m, done, sn)
        _check_services(m, sn)
        await sn.clients.device("n01-npu2").SetFaultState(device_pb2.FaultState(faulted=False))
        again = parse(await scrape(sn.local.metrics.url))
        assert value(again, "cmemu_device_healthy", device="n01-npu2") == 1
        assert value(again, "cmemu_device_faults_total", device="n01-npu2") == 1


async def test_only_get_metrics_is_served_and_openmetrics_on_request() -> None:
    async with running_supernode("cm-mini") as sn, aiohttp.ClientSession() as session:
        assert sn.local.metrics is not None
        url = sn.local.metrics.url
        async with session.get(url.replace("/metrics", "/nope")) as response:
            assert response.status == 404
        async with session.post(url, data=b"x") as response:
            assert response.status == 405
        async with session.get(url + "?x=1") as response:
            assert response.status == 200
        text = await scrape(url, accept="application/openmetrics-text; version=1.0.0")
        assert text.rstrip().endswith("# EOF")
        assert "cmemu_device_healthy" in text


async def test_the_mqtt_link_of_the_process() -> None:
    async with running_supernode("cm-mini", broker=EMBEDDED) as sn:
        assert sn.local.metrics is not None
        for _ in range(100):  # the bus connects in the background
            m = parse(await scrape(sn.local.metrics.url))
            if value(m, "cmemu_mqtt_connected", supernode="sn0") == 1:
                break
            await asyncio.sleep(0.1)
        assert value(m, "cmemu_mqtt_connected") == 1
        assert value(m, "cmemu_mqtt_dropped_total") == 0
        assert value(m, "cmemu_mqtt_backlog_messages") >= 0
    async with running_supernode("cm-mini") as sn:  # no broker: no MQTT families
        assert sn.local.metrics is not None
        assert "cmemu_mqtt_connected" not in parse(await scrape(sn.local.metrics.url))


async def test_a_taken_metrics_port_fails_the_start_naming_it() -> None:
    base = free_port_block(server_count(build("cm-mini")))
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=base)),
        broker=NO_BROKER,
        drain_s=0.0,
    )
    port = options.topology().metrics_port
    assert port == base + server_count(build("cm-mini")) - 1  # after every other server
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(AddressInUseError, match=f"127.0.0.1:{port}"):
            async with Supernode.start(options):
                pass
    async with Supernode.start(options) as sn:  # nothing was left behind
        assert sn.local.metrics is not None


async def test_metrics_off_serves_none() -> None:
    base = free_port_block(server_count(build("cm-mini")))
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=base)),
        broker=NO_BROKER,
        drain_s=0.0,
        metrics=False,
    )
    async with Supernode.start(options) as sn:
        assert sn.topology.metrics_port is None and sn.local.metrics is None


def test_addresses_follow_the_plans() -> None:
    ports = build("cm-mini")
    assert ports.metrics_port == 21000 + server_count(ports) - 1
    assert metrics_address(ports, ports.devices[0].address) == f"127.0.0.1:{ports.metrics_port}"
    loop = build("cm-mini", plan=LoopbackPlan())
    assert metrics_address(loop, loop.devices[3].address) == f"127.10.1.4:{METRICS_PORT}"
    fabric = loop.service(ServiceKind.FABRIC).address
    per_node = {n: [d.id for d in loop.in_node(n)] for n in loop.nodes} | {"fabric": ["fabric"]}
    assert endpoints(loop, per_node) == {
        "n00": f"http://127.10.1.1:{METRICS_PORT}/metrics",
        "n01": f"http://127.10.1.14:{METRICS_PORT}/metrics",
        "fabric": f"http://{fabric.rpartition(':')[0]}:{METRICS_PORT}/metrics",
    }
    assert endpoints(ports, {"sn0": [d.id for d in ports.devices]}) == {
        "sn0": f"http://127.0.0.1:{ports.metrics_port}/metrics"
    }
    # one host has room for one /metrics: processes on ports of one host serve none
    procs_on_ports = LaunchOptions(preset="cm-mini", mode=Procs(plan=PortPlan()))
    assert procs_on_ports.topology().metrics_port is None
    assert LaunchOptions(preset="cm-mini", mode=Procs()).topology().metrics_port == METRICS_PORT
    old = json.loads(ports.to_json())
    del old["metrics_port"]  # a document from before metrics: no process serves them
    assert type(ports).from_dict(old).metrics_port is None


def test_contributed_families_and_a_bad_one() -> None:
    """What a service state's metrics() returns (the serving router's TTFT, say) is exposed with
    the service's labels; a family that breaks the rules is dropped, not the scrape."""
    ttft = Histogram()
    for seconds in (0.02, 0.2, 2.0):
        ttft.observe(seconds)
    out = Families()
    out.extend(
        [
            Family(
                name="cmemu_serving_ttft_seconds",
                help="Time to first token (emulated)",
                type="histogram",
                samples=[({"model": "m"}, ttft)],
            ),
            Family(
                name="cmemu_serving_tokens_total",
                help="Tokens generated",
                type="counter",
                samples=[({"model": "m"}, 42)],
            ),
            Family(
                name="cmemu_serving_bad",
                help="Two label sets",
                type="gauge",
                samples=[({"a": "1"}, 1), ({"b": "2"}, 2)],
            ),
        ],
        {"supernode": "sn0", "device": "router", "kind": "router"},
    )
    body, skipped = exposition.render(out.raw())
    assert skipped == ["cmemu_serving_bad"]
    m = parse(body.decode())
    assert value(m, "cmemu_serving_ttft_seconds_count", device="router", model="m") == 3
    assert value(m, "cmemu_serving_ttft_seconds_bucket", le="0.3", kind="router") == 2
    assert value(m, "cmemu_serving_ttft_seconds_sum") == pytest.approx(2.22)
    assert value(m, "cmemu_serving_tokens_total", supernode="sn0") == 42
    assert "cmemu_serving_bad" not in m


def test_histogram_bounds_are_checked() -> None:
    with pytest.raises(InvalidArgumentError):
        Histogram(bounds=())
    with pytest.raises(InvalidArgumentError):
        Histogram(bounds=(1.0, 0.5))
    with pytest.raises(InvalidArgumentError):
        Histogram(bounds=(1.0, float("inf")))
    h = Histogram(bounds=(1.0, 2.0))
    for x in (1.0, 1.5, 3.0):
        h.observe(x)
    assert h.cumulative() == [(1.0, 1), (2.0, 2), (float("inf"), 3)] and h.count == 3


# --- the CLI ------------------------------------------------------------------------------------


@contextmanager
def up(state_file: Path, *args: str, output: list[str] | None = None) -> Iterator[dict[str, str]]:
    """`cmemu up ARGS` as a real process; yields the metrics URLs its state file records."""
    with cmemu_up(state_file, "--broker", "none", *args, output=output):
        doc = json.loads(state_file.read_text())
        yield doc["launcher"]["metrics"]


def status_json(state_file: Path) -> dict[str, object]:
    result = run_cmemu("status", "--state-file", str(state_file), "--json")
    assert result.returncode == 0, result.stderr
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


async def test_cmemu_up_records_its_endpoint_and_a_cli_fault_shows(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    output: list[str] = []
    with up(state_file, "--preset", "cm-mini", "--base-port", str(base), output=output) as urls:
        url = f"http://127.0.0.1:{base + server_count(build('cm-mini')) - 1}/metrics"
        assert urls == {"sn0": url}
        assert status_json(state_file)["metrics"] == urls
        text = run_cmemu("status", "--state-file", str(state_file)).stdout
        assert f"metrics    {url}  (sn0)" in text
        fault = run_cmemu(
            "fault", "add", "device-down", "n00-npu1", "--state-file", str(state_file)
        )
        assert fault.returncode == 0, fault.stderr
        m = parse(await scrape(url))
        assert value(m, "cmemu_device_healthy", device="n00-npu1", node="n00", kind="npu") == 0
        assert value(m, "cmemu_device_healthy", device="n00-npu0") == 1
    assert f"  metrics     {url}" in output[0]


def test_cmemu_up_metrics_none(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    with up(
        state_file, "--preset", "cm-mini", "--base-port", str(base), "--metrics", "none"
    ) as urls:
        assert urls == {}
        assert "metrics    none" in run_cmemu("status", "--state-file", str(state_file)).stdout
        port = base + server_count(build("cm-mini")) - 1
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # nobody listens
    bad = run_cmemu("up", "--metrics", "maybe", "--state-file", str(state_file))
    assert bad.returncode == 2 and "--metrics" in bad.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
async def test_procs_mode_has_one_endpoint_per_process(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with up(state_file, "--preset", "cm-mini", "--mode", "procs") as urls:
        topology = build("cm-mini", plan=LoopbackPlan())
        hosted = [x.id for x in topology.services if x.kind in SERVICE_SPECS]  # all it runs
        assert sorted(urls) == sorted([*topology.nodes, *hosted])
        assert len(set(urls.values())) == len(urls)
        clients = Clients(topology)
        try:
            await clients.device("n01-cpu2").SetFaultState(device_pb2.FaultState(faulted=True))
        finally:
            await clients.close()
        for node in topology.nodes:
            m = parse(await scrape(urls[node]))
            devices = {s["device"] for s in samples(m, "cmemu_device_healthy")}
            assert devices == {d.id for d in topology.in_node(node)}
            assert "cmemu_fabric_flows_in_flight" not in m
        n01 = parse(await scrape(urls["n01"]))
        assert value(n01, "cmemu_device_healthy", device="n01-cpu2", kind="cpu") == 0
        fabric = parse(await scrape(urls["fabric"]))
        assert "cmemu_device_healthy" not in fabric
        assert value(fabric, "cmemu_fabric_flows_in_flight", device="fabric") == 0
        ems = parse(await scrape(urls["ems"]))
        assert value(ems, "cmemu_ems_objects", tier="dram") == 0
        assert value(ems, "cmemu_process_servers") == 1
        status = run_cmemu("status", "--state-file", str(state_file))
        assert status.stdout.count("/metrics") == 4  # the first four, and how many more
        assert status_json(state_file)["metrics"] == urls
