"""Performing a step plan on the live supernode, and what it measured (the driver,
driver.py, runs the engine and times these out; this module only measures):
- LOOKUP: EMS MatchPrefix of the prompt's tokens (the hit count is EMS's; the lookup's cost is
  the calibration's, as MatchPrefix moves no data);
- PREFILL, DECODE: one MoE dispatch and one combine of the plan's shape through the fabric's
  Collective over the instance's dies (the engine multiplies by layers and microbatches);
- TRANSFER: the KV cache as one size-only UB write (or an RDMA write across supernodes) from a
  prefill NPU into the decode NPU's KV region, timed by the fabric; the prompt's new blocks are
  stored in EMS off the critical path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from cmemu.emulator.engines.gateway.kv import KvOverRdma
from cmemu.emulator.engines.peers import CollectiveOutcome
from cmemu.emulator.engines.serving.peers import KvStore, ServingDirectory
from cmemu.emulator.engines.serving.stats import DeploymentStats, RequestMetrics
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.ems.objects import ObjectKind
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.serving.engine import PlanKind, StepPlan, StepResult, rank_dies
from cmemu.emulator.model.topology import Device
from cmemu.emulator.model.ub import Op, Transaction

log = structlog.get_logger("cmemu.router")

KV_BLOCK_KIND = ObjectKind.KV


@dataclass(frozen=True, kw_only=True)
class LiveInstance:
    """An engine instance on real hardware: its NPUs and their dies in layout order, and where
    KV caches arriving on each NPU go (a region of its HBM)."""

    id: str
    npus: tuple[Device, ...]
    dies: tuple[str, ...]
    kv_offsets: tuple[int, ...] = ()  # per NPU: the KV region's offset (decode instances)


@dataclass(frozen=True, kw_only=True)
class ServingModel:
    """What the driver needs of the model: block size and KV bytes per token."""

    block_tokens: int
    kv_bytes_per_token: int
    lookup_s: float


class Requested(Protocol):
    """What measuring reads of a request in flight (the driver's Stream)."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def metrics(self) -> RequestMetrics: ...


class Measures:
    """One deployment's plans, performed: `await measures(plan)` is what the plan took."""

    def __init__(
        self,
        *,
        name: str,
        model: ServingModel,
        instances: Mapping[str, LiveInstance],
        streams: Mapping[str, Requested],
        stats: DeploymentStats,
        ems: KvStore,
        peers: ServingDirectory,
        kv_rdma: KvOverRdma | None,
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        self.name = name
        self.model = model
        self.instances = instances
        self.streams = streams
        self.stats = stats
        self.ems = ems
        self.peers = peers
        self.kv_rdma = kv_rdma
        self._spawn = spawn

    async def __call__(self, plan: StepPlan) -> StepResult:
        if plan.kind is PlanKind.LOOKUP:
            return await self._lookup(plan)
        if plan.kind is PlanKind.TRANSFER:
            return await self._transfer(plan)
        return await self._moe(plan)  # PREFILL and DECODE

    async def _lookup(self, plan: StepPlan) -> StepResult:
        (request_id,) = plan.requests
        stream = self.streams.get(request_id)
        if stream is None:
            return StepResult(lookup_s=self.model.lookup_s)
        reply = await self.ems.match_prefix(
            stream.tokens, block_tokens=self.model.block_tokens, namespace=self.name
        )
        hit = min(reply.matched_tokens, len(stream.tokens))
        stream.metrics.prefix_hit_tokens = hit
        self.stats.lookup_tokens += len(stream.tokens)
        return StepResult(matched_blocks=reply.matched_blocks, lookup_s=self.model.lookup_s)

    async def _moe(self, plan: StepPlan) -> StepResult:
        if plan.kind is PlanKind.PREFILL:
            for request_id in plan.requests:
                stream = self.streams.get(request_id)
                if stream is not None and stream.metrics.prefill_start_ns is None:
                    stream.metrics.prefill_start_ns = round(plan.start_s * 1e9)
        shape = plan.moe
        if shape is None or shape.tokens_per_rank == 0:
            return StepResult()
        ranks = rank_dies(self.instances[plan.instance].dies, shape)
        fabric = self.peers.fabric()

        async def collective(op: str) -> CollectiveOutcome:
            spec = CollectiveSpec(op=op, tokens_per_rank=shape.tokens_per_rank)
            return await fabric.collective(ranks, spec)

        dispatch, combine = await asyncio.gather(
            collective("moe-dispatch"), collective("moe-combine")
        )
        return StepResult(
            dispatch_s=dispatch.duration_ns / 1e9,
            combine_s=combine.duration_ns / 1e9,
            compute_share=min(dispatch.compute_share, combine.compute_share),
        )

    def _pair(self, plan: StepPlan) -> tuple[Device, Device, int]:
        """The NPUs a request's KV cache moves between: each instance's first in service (where
        the simulator moves it too), and the offset of the receiving NPU's KV region."""
        t = plan.transfer
        assert t is not None
        src = self.instances[t.src]
        dst = self.instances[t.dst]
        return src.npus[t.src_npu], dst.npus[t.dst_npu], dst.kv_offsets[t.dst_npu]

    async def _transfer(self, plan: StepPlan) -> StepResult:
        assert plan.transfer is not None
        src, dst, offset = self._pair(plan)
        if plan.block_keys:
            self._spawn(self._store_blocks(plan.block_keys, src.id), f"store-{plan.id}")
        if plan.transfer.bytes == 0:
            return StepResult()
        if self.kv_rdma is not None:
            took_s = await self.kv_rdma.write(src, dst, offset, plan.transfer.bytes)
            return StepResult(transfer_s=took_s)
        tx = Transaction(
            op=Op.WRITE, dst_eid=dst.eid, dst_offset=offset, size=plan.transfer.bytes,
            size_only=True,
        )  # fmt: skip
        done = await self.peers.device(src).submit(tx, deadline_s=None)
        return StepResult(transfer_s=(done.complete_ns - done.issue_ns) / 1e9)

    async def _store_blocks(self, keys: Sequence[str], device: str) -> None:
        """The prompt's new KV blocks into EMS, from the prefill NPU (not on the critical path:
        a failure costs only future hits)."""
        size = self.model.block_tokens * self.model.kv_bytes_per_token
        try:
            await self.ems.put_sizes(keys, size=size, kind=KV_BLOCK_KIND, device=device)
        except EmulatorError as exc:
            log.warning("storing KV blocks failed", deployment=self.name, error=str(exc))

    def pairs(self, plan: StepPlan) -> list[Device]:
        """The NPUs a failed plan ran on (what to probe)."""
        if plan.transfer is not None:
            src, dst, _ = self._pair(plan)
            return [src, dst]
        return list(self.instances[plan.instance].npus)
