"""Dynamic PD (issue 24 item 4), the deciding half: what one unit of NPUs does in each role, the
demand a window of arrivals puts on each role, and the policies that pick the prefill:decode
split, registered by name in POLICIES (an unknown name is an UnknownNameError listing them).

A unit is one prefill instance of the deployment (`prefill.npus` NPUs, EP over all its dies); in
the decode role the same NPUs run one decode instance of that size. Its figures come from the
serving cost model, never a constant of ours: a prefill unit's time for a prompt of L tokens is
its prefill batch of such prompts (cost.prefill_batch, the MoE collectives timed by the
CommModel on the unit's dies) shared among the batch's prompts; a decode unit holds
`batch_per_die x dies` requests at the SLO operating point (operating.py) at the workload's
longest mean context, each for its output tokens x that point's TPOT. Changing role reloads the
model's weights from EMS (`serving.cache_from_ems_s`).

`dynamic` sizes each role to the demand of the last `window_s` of arrivals (prefill seconds and
decode slot-seconds per second, plus what waits, cleared over `horizon_s`) with `headroom`, and
switches only when it pays: the requests the new split serves more over `horizon_s`, minus those
the switching units do not serve while they reload, must be positive. With a reload longer than
the horizon nothing ever pays, and a split that is already right gains nothing: no flapping.
`fixed` keeps the split it starts with.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.comm import comm_model, topology_for
from cmemu.emulator.model.serving.deployment import Deployment, instance_dies, layout
from cmemu.emulator.model.serving.experts import imbalance
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.operating import DecodeCurve, OperatingPoint, point_on
from cmemu.emulator.model.topology import DeviceKind


@dataclass(frozen=True, kw_only=True)
class PdOptions:
    """How the split is decided; every field validated by `check_options`."""

    policy: str = "dynamic"
    prefill_units: int = 0  # the split to start with; 0: the deployment's prefill share
    interval_s: float = 30.0  # how often the policy decides
    window_s: float = 120.0  # the arrivals the demand is measured over
    horizon_s: float = 1800.0  # how long a new split is expected to serve before the mix moves
    headroom: float = 0.2  # capacity kept above the demand, per role


class UnitRates:
    """One unit's figures in each role (module docstring). A decode unit's batch depends on its
    requests' context (the longer, the fewer meet the TPOT target and fit HBM): a request holds
    `1 / batch` of a unit, `batch` the operating point's at its context, for its output tokens
    x that point's TPOT (lengths rounded up to `CONTEXT_STEP` tokens, one point each)."""

    CONTEXT_STEP = 1024

    def __init__(self, d: Deployment, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.npus = d.prefill.npus
        if d.npus % self.npus:
            raise InvalidArgumentError(
                f"the deployment's {d.npus} NPUs are not whole units of {self.npus} (prefill.npus)",
                field="prefill.npus",
            )
        self.units = d.npus // self.npus
        self.dies = self.npus * profile.npu.dies
        self.target_s = d.decode.tpot_target_s
        self.load_s = profile.serving.cache_from_ems_s  # a role change: weights from EMS
        unit = dataclasses.replace(d.decode, instances=1, npus=self.npus, ep=0)
        self._curve = DecodeCurve(
            dataclasses.replace(d, decode=unit), prompt_tokens=1, output_tokens=1, profile=profile
        )
        self._points: dict[tuple[int, int], OperatingPoint] = {}
        self.prefill_s: Callable[[int], float] = cache(_PrefillCurve(d, profile).seconds)

    def point(self, prompt: int, output: int) -> OperatingPoint:
        """The decode unit's operating point for requests of these lengths (each rounded up)."""
        step = self.CONTEXT_STEP
        key = (-(-prompt // step) * step, -(-output // step) * step)
        found = self._points.get(key)
        if found is None:
            curve = self._curve.at(prompt_tokens=key[0], output_tokens=key[1])
            found = self._points[key] = point_on(curve, self.target_s)
        return found

    def decode(self, prompt: int, output: int) -> tuple[float, float]:
        """(the share of a decode unit a request holds, how long it holds it)."""
        point = self.point(prompt, output)  # the first token is prefill's: output - 1 steps
        return 1.0 / (point.batch_per_die * self.dies), (output - 1) * point.tpot_s


def unit_rates(d: Deployment, *, profile: HardwareProfile = DEFAULT_PROFILE) -> UnitRates:
    return UnitRates(d, profile)


class _PrefillCurve:
    """A prefill unit's batch time for prompts of one length, from the cost model."""

    def __init__(self, d: Deployment, profile: HardwareProfile) -> None:
        self.d, self.profile = d, profile
        self.model = get_model(d.model)
        topology = topology_for(d.preset, profile)
        npus = [x.id for x in topology.devices if x.kind is DeviceKind.NPU]
        self.dies = d.prefill_dies(profile)
        self.ep = d.prefill_ep(profile)
        self.ranks = instance_dies(layout(d, npus)[d.prefill_ids()[0]], profile)[: self.ep]
        self.comm = comm_model(topology, d.platform, profile)
        self.imbalance = imbalance(self.model, self.ep, d.placement, profile)

    def seconds(self, prompt: int) -> float:
        """One prompt of `prompt` tokens' share of a batch of such prompts (as many as
        `prefill.batch_tokens` holds, at least one)."""
        p = self.d.prefill
        prompts = max(1, p.batch_tokens // prompt)
        tokens = prompts * prompt
        per_die = tokens / self.dies
        dispatch, combine = self.comm.moe(
            self.ranks,
            cost.prefill_tokens_per_rank(
                tokens_per_die=int(per_die), microbatches=p.microbatches, dies=self.dies, ep=self.ep
            ),
        )
        step = cost.prefill_batch(
            self.model,
            tokens_per_die=per_die,
            attention_pairs_per_die=prompts * prompt * (prompt + 1) / 2 / self.dies,
            requests_per_die=prompts / self.dies,
            load_s=0.0,
            microbatches=p.microbatches,
            imbalance=self.imbalance,
            dies=self.dies,
            ep=self.ep,
            dispatch_s=dispatch,
            combine_s=combine,
            profile=self.profile,
        )
        return step.total_s / prompts


@dataclass(frozen=True)
class Demand:
    """What the recent arrivals ask of each role, in units busy, and the request rate."""

    prefill_units: float
    decode_units: float
    requests_per_s: float

    @property
    def prefill_share(self) -> float:
        total = self.prefill_units + self.decode_units
        return self.prefill_units / total if total else 0.0


def served(p: int, d: int, demand: Demand, headroom: float) -> float:
    """The share of the demand `p` prefill and `d` decode units carry with headroom."""
    share = 1.0
    if demand.prefill_units > 0:
        share = min(share, p / (demand.prefill_units * (1 + headroom)))
    if demand.decode_units > 0:
        share = min(share, d / (demand.decode_units * (1 + headroom)))
    return share


Policy = Callable[[int, int, Demand, PdOptions, float], int]


def _fixed(p: int, total: int, demand: Demand, o: PdOptions, load_s: float) -> int:
    return p


def _dynamic(p: int, total: int, demand: Demand, o: PdOptions, load_s: float) -> int:
    """The split that serves the most (the nearest to `p` among equals), if moving to it pays
    for its reload (module docstring); else `p`."""
    h = o.headroom
    now = served(p, total - p, demand, h)
    best = max(range(1, total), key=lambda q: (served(q, total - q, demand, h), -abs(q - p)))
    gain = served(best, total - best, demand, h) - now
    if best == p or gain <= 1e-9:
        return p
    moving = abs(best - p)
    p_during, d_during = (p - moving, total - p) if best < p else (p, total - p - moving)
    lost = now - served(p_during, d_during, demand, h)
    pays = gain * max(0.0, o.horizon_s - load_s) - lost * load_s
    return best if pays > 0 else p


POLICIES: dict[str, Policy] = {"fixed": _fixed, "dynamic": _dynamic}


class DemandMeter:
    """The arrivals of the last `window_s` (each with its prefill seconds and decode
    unit-seconds) and what they ask of each role: what the model-mode simulation and the live
    router both measure, so the policy sees the same thing in both."""

    def __init__(self, o: PdOptions) -> None:
        self.o = o
        self.recent: deque[tuple[float, float, float]] = deque()  # arrival, prefill s, slot s

    def arrive(self, t: float, prefill_s: float, slot_s: float) -> None:
        self.recent.append((t, prefill_s, slot_s))

    def demand(
        self, t: float, waiting_prefill_s: float = 0.0, waiting_slot_s: float = 0.0
    ) -> Demand:
        """The demand at `t`: the window's arrivals per second, plus the work waiting (prompts
        not prefilled yet, prefilled requests without a decode slot) cleared over `horizon_s`."""
        window = self.o.window_s
        while self.recent and self.recent[0][0] < t - window:
            self.recent.popleft()
        span = min(window, t) or 1.0
        clear = span / self.o.horizon_s
        prefill_s = sum(x[1] for x in self.recent) + waiting_prefill_s * clear
        unit_s = sum(x[2] for x in self.recent) + waiting_slot_s * clear
        return Demand(
            prefill_units=prefill_s / span,
            decode_units=unit_s / span,
            requests_per_s=len(self.recent) / span,
        )


def next_move(
    prefill: int,
    units: int,
    *,
    going: str,
    switching: int,
    demand: Demand,
    o: PdOptions,
    load_s: float,
) -> tuple[str, int] | None:
    """The switch the policy asks for now, as (role the units go to, how many), or None. Units
    on their way (`switching` of them, going to role `going`, "" for none) count in their new
    role, and a switch is never reversed midway: a move the other way waits until they joined."""
    p_to = prefill + (switching if going == "prefill" else 0)
    want = POLICIES[o.policy](p_to, units, demand, o, load_s)
    to = "decode" if want < p_to else "prefill"
    if want == p_to or (going and to != going):
        return None
    return to, abs(want - p_to)


def check_options(o: PdOptions, units: int) -> None:
    """Every option in range for a deployment of `units` units."""
    if o.policy not in POLICIES:
        raise UnknownNameError("PD policy", o.policy, list(POLICIES), field="policy")
    if units < 2:
        raise InvalidArgumentError(
            f"dynamic PD needs at least 2 units (one per role), the deployment has {units}",
            field="prefill.npus",
        )
    if not 0 <= o.prefill_units < units:
        raise InvalidArgumentError(
            f"prefill_units must be 1..{units - 1} (or 0: the deployment's), got {o.prefill_units}",
            field="prefill_units",
        )
    for name in ("interval_s", "window_s", "horizon_s"):
        if not getattr(o, name) > 0:
            raise InvalidArgumentError(f"{name} must be > 0, got {getattr(o, name)}", field=name)
    if not o.headroom >= 0:
        raise InvalidArgumentError(f"headroom must be >= 0, got {o.headroom}", field="headroom")


def live_options(d: Deployment) -> PdOptions | None:
    """A live deployment's dynamic PD (its `pd` section), checked; None when it is `fixed`
    (nothing runs: the deployment serves as deployed). The live router moves whole instances,
    so a decode instance must be one unit (`decode.npus == prefill.npus`)."""
    pd = d.pd
    if pd.policy == "fixed":
        return None
    if d.decode.npus != d.prefill.npus:
        raise InvalidArgumentError(
            f"live dynamic PD moves whole instances between the roles: decode.npus "
            f"({d.decode.npus}) must equal prefill.npus ({d.prefill.npus})",
            field="pd.policy",
        )
    o = PdOptions(
        policy=pd.policy,
        interval_s=pd.interval_s,
        window_s=pd.window_s,
        horizon_s=pd.horizon_s,
        headroom=pd.headroom,
    )
    check_options(o, d.decode.instances + d.prefill.instances)
    return o
