"""SLO-driven operating points (issue 23 item 3): given a TPOT target, the largest decode batch
per die that meets it, as the paper reports its rows ("1,943 tokens/s per NPU at TPOT 49.4 ms").

The batch is searched between 1 and the HBM bound at the workload's context (hbm.py): a batch
that does not fit is never a candidate, however fast. Each candidate's TPOT is the simulator's
own decode step (cost.decode_step, with the MoE collectives timed by the same CommModel on the
same dies as the simulator's decode instance) at the mean context a request has while it decodes
(prompt + half its output), divided by the tokens a step emits (1.7 with MTP). The step time
grows with the batch (more tokens through every kernel and collective), so the largest batch
meeting the target is found by bisection.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.comm import comm_model, topology_for
from cmemu.emulator.model.serving.deployment import Deployment, instance_dies, layout
from cmemu.emulator.model.serving.experts import placement
from cmemu.emulator.model.serving.hbm import check_weights_fit, die_memory
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.topology import DeviceKind


@dataclass(frozen=True, kw_only=True)
class OperatingPoint:
    target_tpot_s: float
    batch_per_die: int
    tpot_s: float
    tokens_per_s_per_npu: float  # decode output tokens per decode NPU (both dies)
    hbm_batch_per_die: int  # the search's ceiling: the largest batch that fits HBM
    prompt_tokens: float
    output_tokens: float
    microbatches: int  # the decode step's microbatches at this point (1 or 2)


MICROBATCHES = (1, 2)  # what a decode step can run (deployment.py's check)


class DecodeCurve:
    """TPOT of a deployment's decode instance as a function of its batch per die."""

    def __init__(
        self,
        d: Deployment,
        *,
        prompt_tokens: float,
        output_tokens: float,
        profile: HardwareProfile = DEFAULT_PROFILE,
    ) -> None:
        self.d = d
        self.profile = profile
        self.model = get_model(d.model)
        self.dies = d.decode_dies(profile)
        self.ep = d.decode_ep(profile)
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        topology = topology_for(d.preset, profile)
        npus = [x.id for x in topology.devices if x.kind is DeviceKind.NPU]
        first = d.decode_ids()[0]
        self.ranks = instance_dies(layout(d, npus)[first], profile)[: self.ep]
        self.comm = comm_model(topology, d.platform, profile)
        experts = placement(self.model, self.ep, d.placement, profile)
        self.imbalance = 1.0 if d.placement == "ideal" else max(1.0, experts.imbalance)
        self.tokens_per_step = profile.serving.mtp_tokens_per_step if d.decode.mtp else 1.0
        self.memory = memory = die_memory(self.model, self.ep, mtp=d.decode.mtp, profile=profile)
        self.hbm_batch = memory.max_batch(prompt_tokens + output_tokens)
        self._tpot: dict[int, float] = {}

    def at(self, *, prompt_tokens: float, output_tokens: float) -> DecodeCurve:
        """The same instance at other lengths, sharing the topology and collective timings."""
        other = copy.copy(self)
        other.prompt_tokens, other.output_tokens = prompt_tokens, output_tokens
        other.hbm_batch = self.memory.max_batch(prompt_tokens + output_tokens)
        other._tpot = {}
        return other

    def tpot_s(self, batch_per_die: int) -> float:
        found = self._tpot.get(batch_per_die)
        if found is None:
            step = self.step(batch_per_die)
            found = self._tpot[batch_per_die] = step.total_s / self.tokens_per_step
        return found

    def moe_s(self, batch_per_die: int) -> tuple[float, float]:
        """(dispatch, combine): one of each of a step's MoE collectives at `batch_per_die`."""
        decode = self.d.decode
        tokens = cost.decode_tokens_per_rank(
            batch_per_die=batch_per_die,
            mtp=decode.mtp,
            microbatches=decode.microbatches,
            dies=self.dies,
            ep=self.ep,
            model=self.model,
        )
        return self.comm.moe(self.ranks, tokens)

    def step(self, batch_per_die: int) -> cost.StepTime:
        """One decode step of the instance at `batch_per_die`, and where its time went."""
        decode = self.d.decode
        dispatch, combine = self.moe_s(batch_per_die)
        return cost.decode_step(
            self.model,
            batch_per_die=batch_per_die,
            kv_tokens=self.prompt_tokens + self.output_tokens / 2,
            mtp=decode.mtp,
            microbatches=decode.microbatches,
            imbalance=self.imbalance,
            dies=self.dies,
            ep=self.ep,
            dispatch_s=dispatch,
            combine_s=combine,
            profile=self.profile,
        )

    def point(self, target_tpot_s: float, batch_per_die: int) -> OperatingPoint:
        tpot = self.tpot_s(batch_per_die)
        return OperatingPoint(
            target_tpot_s=target_tpot_s,
            batch_per_die=batch_per_die,
            tpot_s=tpot,
            tokens_per_s_per_npu=self.profile.npu.dies * batch_per_die / tpot,
            hbm_batch_per_die=self.hbm_batch,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            microbatches=self.d.decode.microbatches,
        )


def operating_point(
    d: Deployment,
    target_tpot_s: float,
    *,
    prompt_tokens: float,
    output_tokens: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> OperatingPoint:
    """The deployment's best decode operating point at `target_tpot_s`: for one microbatch and
    for two, the largest batch per die within the HBM bound that meets it, and of those the one
    with the most tokens per NPU (PreconditionError saying why when none meets it). Both are
    tried because the target decides which wins: two hide the MoE collectives behind each
    other's compute, which pays at large batches; at a tight target the batch is small, a second
    microbatch re-reads every weight and launches every kernel again, and one is faster (the
    paper's small-batch rows). The point says which (`microbatches`)."""
    points: list[OperatingPoint] = []
    refusals: list[tuple[float, PreconditionError]] = []  # the lowest TPOT of each, and why
    for microbatches in MICROBATCHES:
        decode = dataclasses.replace(d.decode, microbatches=microbatches)
        curve = DecodeCurve(
            dataclasses.replace(d, decode=decode),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            profile=profile,
        )
        try:
            points.append(point_on(curve, target_tpot_s))
        except PreconditionError as exc:
            refusals.append((curve.tpot_s(1), exc))
    if not points:  # the refusal of the faster of the two names the lowest TPOT there is
        raise min(refusals, key=lambda r: r[0])[1]
    return max(points, key=lambda p: (p.tokens_per_s_per_npu, p.microbatches))


def point_on(curve: DecodeCurve, target_tpot_s: float) -> OperatingPoint:
    """`operating_point` on a curve already built (its lengths and deployment)."""
    prompt_tokens, output_tokens = curve.prompt_tokens, curve.output_tokens
    top = curve.hbm_batch
    context = f"{prompt_tokens:.0f} + {output_tokens:.0f} tokens"
    if top < 1:
        check_weights_fit(curve.memory, "decode")
        raise PreconditionError(
            f"no batch fits a decode die's HBM at {context} of context per request"
        )
    if curve.tpot_s(1) > target_tpot_s:
        raise PreconditionError(
            f"no batch meets TPOT {target_tpot_s * 1e3:g} ms: the lowest, at 1 request per "
            f"die, is {curve.tpot_s(1) * 1e3:.1f} ms",
            field="slo_tpot",
        )
    lo, hi = 1, top  # tpot(lo) meets the target; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if curve.tpot_s(mid) <= target_tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return curve.point(target_tpot_s, lo)
