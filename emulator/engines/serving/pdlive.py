"""Live dynamic PD (issue 24 item 4): a deployment's instances moved between prefill and decode
as the prompt/output mix and the load change, on the live supernode.

The deciding is the model mode's (emulator/model/serving/pdpolicy.py), not a second policy: each
arrival is measured as `cmemu simulate pd` measures it (its prefill seconds on a unit, the decode
unit-seconds it holds: `UnitRates`, the serving cost model's figures) into the same
`DemandMeter`, and every `interval_s` of emulated time the registered policy named by the
deployment's `pd` section picks the split through `next_move`. A unit is one instance (a live
deployment with dynamic PD has `decode.npus == prefill.npus`), and it keeps its name and NPUs
through a change.

A switch, at the emulated instant the policy asked for it:
1. the moving instances stop taking new work in their old role (the engine's `retire`: a prefill
   instance's queue goes to the others) and finish what they hold (a prefill batch and the KV
   caches it made; a decode instance's requests, to their last token);
2. once an instance holds nothing it leaves the engine and reloads the weights for real: an EMS
   Get of every WEIGHTS shard from its first NPU (a shard EMS lost is put again, a cold load),
   joining no earlier than the model-caching figure says (`serving.cache_from_ems_s`, the
   policy's own switch cost; `cache_cold_s` when a shard was missing). Going to decode, its NPUs
   get a KV region first, as a decode instance's do at deploy;
3. it joins its new role, built as an instance of that role is at the start.
A switch is never reversed midway; the policy does not decide while instances still drain.

Visible: events `pd-switch` (direction, units, instances, at) and `pd-joined` (instance, role,
at); GetDeployment's `pd` (the split, instances switching, every switch); the Prometheus gauge
`cmemu_serving_pd_units{deployment,role}`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.serving.deploy import (
    WEIGHTS_KIND,
    LiveDeployment,
    Provisioner,
    weight_plan,
)
from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, relayed
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.serving.live import PdStatus, PdSwitch
from cmemu.emulator.model.serving.pdpolicy import DemandMeter, PdOptions, UnitRates, next_move
from cmemu.emulator.model.serving.plans import Request

log = structlog.get_logger("cmemu.router")

SWITCHING = "switching"  # an instance's role while it reloads its weights (GetDeployment)
OTHER = {"prefill": "decode", "decode": "prefill"}


@dataclass
class Switch:
    """One switch: when the policy asked for it, where to, the instances moving and when each
    joined its new role (emulated ns)."""

    at_ns: int
    to: str
    instances: tuple[str, ...]
    joined: dict[str, int] = field(default_factory=dict)

    @property
    def joined_ns(self) -> int:
        """When the last of its instances joined (0: not all of them yet)."""
        done = len(self.joined) == len(self.instances)
        return max(self.joined.values()) if done else 0


class LivePd:
    """One deployment's dynamic PD; `run` decides every `interval_s` of emulated time (a task of
    the router's TaskGroup, cancelled at undeploy)."""

    def __init__(
        self,
        *,
        live: LiveDeployment,
        driver: Driver,
        provisioner: Provisioner,
        options: PdOptions,
        rates: UnitRates,
        clock: Timeline,
        profile: HardwareProfile,
    ) -> None:
        self.live = live
        self.driver = driver
        self.provisioner = provisioner
        self.o = options
        self.rates = rates
        self.clock = clock
        self.profile = profile
        self.ems = driver.ems
        self.meter = DemandMeter(options)
        self.switches: list[Switch] = []
        self.retiring: dict[str, str] = {}  # instance: the role it goes to, while it drains
        self.reloading: dict[str, str] = {}  # instance: the role it goes to, while it reloads
        self.prefill_share = 0.0  # of the demand measured at the last decision
        self._tasks: set[asyncio.Task[None]] = set()
        driver.on_submit = self._arrived
        driver.on_round = self._drained

    # --- the split now ---------------------------------------------------------------------

    def units(self) -> dict[str, int]:
        """Instances per role now: prefill, decode (retiring ones in their old role) and those
        switching (reloading, in neither)."""
        roles = list(self.driver.engine.roles().values())
        return {
            "prefill": roles.count("prefill"),
            "decode": roles.count("decode"),
            SWITCHING: len(self.reloading),
        }

    def status(self) -> PdStatus:
        u = self.units()
        return PdStatus(
            policy=self.o.policy,
            prefill_units=u["prefill"],
            decode_units=u["decode"],
            switching_units=u[SWITCHING],
            prefill_share=self.prefill_share,
            switches=tuple(
                PdSwitch(at_ns=w.at_ns, to=w.to, instances=w.instances, joined_ns=w.joined_ns)
                for w in self.switches
            ),
        )

    # --- measuring and deciding --------------------------------------------------------------

    async def run(self) -> None:
        """Ask the policy every `interval_s` of emulated time, at exact instants (applied in the
        driver's order of inputs), until cancelled; then stop the reloads in flight."""
        start = self.clock.now_s()
        try:
            for k in range(1, 2**62):
                at = start + k * self.o.interval_s
                await self.clock.sleep_until(round(at * 1e9))
                self.driver.at(at, self._decide)
        finally:
            for task in list(self._tasks):
                task.cancel()

    def _work(self, request: Request) -> tuple[float, float]:
        """A request's prefill seconds on a unit and the decode unit-seconds it holds (a context
        at which no decode batch meets the TPOT target: a whole unit for its output at the
        target, never an error for the request: measuring must not fail what it measures)."""
        prompt, output = request.input_tokens, request.output_tokens
        try:
            share, hold = self.rates.decode(prompt, output)
        except EmulatorError:
            share, hold = 1.0, (output - 1) * self.rates.target_s
        return self.rates.prefill_s(prompt), share * hold

    def _arrived(self, request: Request, at_s: float) -> None:
        self.meter.arrive(at_s, *self._work(request))

    def _decide(self, at_s: float) -> None:
        engine = self.driver.engine
        queued, waiting = engine.backlog()
        demand = self.meter.demand(
            at_s,
            sum(self._work(r)[0] for r in queued),
            sum(self._work(r)[1] for r in waiting),
        )
        if demand.prefill_units + demand.decode_units > 0:  # idle: the last mix measured stays
            self.prefill_share = demand.prefill_share
        if self.retiring or not self.meter.recent:
            return  # instances still finishing their old role's work, or nothing measured yet
        going = next(iter(self.reloading.values()), "")
        move = next_move(
            self.units()["prefill"],
            self.rates.units,
            going=going,
            switching=len(self.reloading),
            demand=demand,
            o=self.o,
            load_s=self.rates.load_s,
        )
        if move is None:
            return
        to, count = move
        try:
            names = engine.retire(OTHER[to], count, at_s)
        except EmulatorError as exc:  # instances out of service (a lost die): not now
            log.warning("dynamic PD cannot switch", deployment=self.driver.name, error=str(exc))
            return
        for name in names:
            self.retiring[name] = to
        at_ns = round(at_s * 1e9)
        self.switches.append(Switch(at_ns=at_ns, to=to, instances=tuple(names)))
        self.driver.publish(
            "pd-switch",
            at_ns,
            direction=f"{OTHER[to]}->{to}",
            units=count,
            instances=names,
            prefill_share=round(demand.prefill_share, 4),
        )

    # --- switching ---------------------------------------------------------------------------

    def _drained(self, at_s: float) -> None:
        """After each round of the driver: a retiring instance that holds nothing leaves."""
        engine = self.driver.engine
        for name, to in list(self.retiring.items()):
            if not engine.drained(name):
                continue
            del self.retiring[name]
            engine.leave(name)
            self.reloading[name] = to
            self.live.roles[name] = SWITCHING
            task = asyncio.get_running_loop().create_task(
                self._reload(name, to, at_s), name=f"{self.driver.name}-pd-{name}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _reload(self, name: str, to: str, left_s: float) -> None:
        """The weights for `name`'s new role through EMS, then it joins (retried after
        `step_retry_s` while EMS or a device fails: the instance stays out of service)."""
        while True:
            try:
                inst = self.driver.instances[name]
                if to == "decode" and not inst.kv_offsets:
                    inst = await self.provisioner.kv_region(self.live, inst)
                    self.driver.instances[name] = inst
                load_s = await self._weights(inst.npus[0].id)
                break
            except asyncio.CancelledError:
                raise
            except EmulatorError as exc:
                log.warning("reloading weights failed", deployment=self.live.name, error=str(exc))
                await self.clock.sleep(self.profile.serving.step_retry_s)
        ready = left_s + load_s
        await self.clock.sleep_until(round(ready * 1e9))
        self.driver.at(ready, lambda t: self._join(name, to, t))

    async def _weights(self, device: str) -> float:
        """Every WEIGHTS shard read from EMS by `device` (one EMS lost is put again); the
        emulated loading time: from EMS, or cold when a shard was missing."""
        cold = False
        for key, size in weight_plan(self.live.spec, self.profile).shards:
            try:
                await self.ems.load(key, device=device)
            except NotFoundError:
                cold = True
                try:
                    await self.ems.put(key, size=size, kind=WEIGHTS_KIND, device=device)
                except EmulatorError as put_exc:
                    raise relayed(put_exc, "ems (weights)") from put_exc
            except EmulatorError as exc:
                raise relayed(exc, "ems (weights)") from exc
        return self.profile.serving.cache_cold_s if cold else self.rates.load_s

    def _join(self, name: str, to: str, at_s: float) -> None:
        self.driver.engine.join(name, to)
        self.reloading.pop(name, None)
        self.live.roles[name] = to
        self.provisioner.place(self.live, self.driver.instances[name])
        at_ns = round(at_s * 1e9)
        for switch in self.switches:
            if name in switch.instances and name not in switch.joined:
                switch.joined[name] = at_ns
                break
        self.driver.publish("pd-joined", at_ns, instance=name, role=to)
