"""A serving deployment on a topology with the RDMA plane (cm-minix1) moves its prefill ->
decode KV caches over the gateway, not over UB."""

from __future__ import annotations

import json
from dataclasses import replace

import openai

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import gateway_pb2 as pb
from cmemu.v1 import router_pb2

PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=8.0, cache_from_ems_s=4.0),
)
SMALL = {"model": "deepseek-r1", "decode": {"npus": 4}, "prefill": {"instances": 1, "npus": 4}}


async def test_prefill_to_decode_kv_goes_over_rdma() -> None:
    async with running_supernode("cm-minix1", time_scale=20.0, profile=PROFILE) as sn:
        deploy = router_pb2.DeployRequest(name="small", spec_yaml=json.dumps(SMALL), wait=True)
        deployment = await sn.clients.router().Deploy(deploy)
        decode_npus = set(deployment.instances[0].npus)
        http = sn.topology.service(ServiceKind.ROUTER).http_address
        client = openai.AsyncOpenAI(base_url=f"http://{http}/v1", api_key="none", max_retries=0)
        try:
            done = await client.completions.create(
                model="small",
                prompt="Tell me about the scale-out plane. " * 20,
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
        finally:
            await client.close()
        assert done.usage is not None and done.usage.completion_tokens == 4
        gw = sn.clients.gateway()
        stats = await gw.GetStats(pb.GatewayStatsRequest())
        assert stats.write_ops >= 1 and stats.bytes_out > 0 and stats.failed_ops == 0
        qps = (await gw.ListQps(pb.ListQpsRequest())).qps
        # each pair: a QP on the prefill NPU, connected to one on a decode NPU, that carried it
        writers = [q for q in qps if q.ops]
        assert writers and all(q.remote_npu in decode_npus for q in writers)
        assert all(q.npu not in decode_npus for q in writers)
