"""The allocation state: which job holds which NPU, the spares, the failed NPUs.

Every NPU is in exactly one of four states: free, allocated (to one job), spare, or failed and
out of service. A failed NPU that a job still holds stays in the job (flagged) until the job's
controller replaces it or releases the job: the scheduler never takes NPUs away on its own.

Allocate refuses what does not fit now (CapacityError: RESOURCE_EXHAUSTED, saying what is free)
instead of queueing it: its callers (a serving deployment sizing its instances, a training
launcher) decide whether to wait, shrink or give up, and a refusal needs no watch API to learn
when a queued job started. A replay that does queue (bench/alloc.py) orders its waiting jobs
with queue.PendingQueue and calls allocate when NPUs come back.

Spares are a reserved set of a target size, spread over the racks so that Replace finds one
close by (the same node, else the same rack, else any). Allocate never hands out a spare; the
spare set is topped up from the free NPUs after every change, as far as they allow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace as dc_replace

from cmemu.emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    quote,
)
from cmemu.emulator.model.scheduler.inventory import Inventory
from cmemu.emulator.model.scheduler.jobs import Allocation, JobRequest, Replacement, check_job
from cmemu.emulator.model.scheduler.policies import DEFAULT_POLICY, FreeNode, get_policy, place
from cmemu.emulator.model.scheduler.spares import SparePool


class Scheduler:
    def __init__(
        self, inventory: Inventory, *, spares: int = 0, default_policy: str = DEFAULT_POLICY
    ) -> None:
        self.inventory = inventory
        self.default_policy = get_policy(default_policy).name
        self._order = {p: i for i, p in enumerate(inventory.npus)}
        self._free: dict[str, set[str]] = {n.id: set(n.npus) for n in inventory.nodes}
        self._owner: dict[str, str] = {}
        self._jobs: dict[str, Allocation] = {}
        self._failed: set[str] = set()
        self._spares = SparePool(inventory, free=self._free, order=self._order)
        self._per_node = max(len(n.npus) for n in inventory.nodes)
        self._per_rack_npus = max(Counter(n.rack for n in inventory.nodes for _ in n.npus).values())
        self.set_spares(spares)

    # --- reading -------------------------------------------------------------------------------

    @property
    def spares(self) -> list[str]:
        return self._sorted(self._spares.npus)

    @property
    def spare_target(self) -> int:
        return self._spares.target

    @property
    def failed(self) -> list[str]:
        return self._sorted(self._failed)

    def free_npus(self) -> list[str]:
        return self._sorted(p for free in self._free.values() for p in free)

    @property
    def free_count(self) -> int:
        return sum(len(free) for free in self._free.values())

    @property
    def allocated_count(self) -> int:
        return len(self._owner)

    def allocations(self) -> list[Allocation]:
        return list(self._jobs.values())

    def get(self, job: str) -> Allocation:
        check_job(job)
        found = self._jobs.get(job)
        if found is None:
            raise NotFoundError(
                f"no job {quote(job)} holds NPUs", field="job", subject=job, reason="JOB_NOT_FOUND"
            )
        return found

    def view(self) -> list[FreeNode]:
        return [
            FreeNode(
                id=n.id,
                rack=n.rack,
                order=i,
                free=tuple(p for p in n.npus if p in self._free[n.id]),
                capacity=len(n.npus),
            )
            for i, n in enumerate(self.inventory.nodes)
        ]

    # --- allocate and release ------------------------------------------------------------------

    def check(self, request: JobRequest) -> None:
        """Refuse a request that could never be placed, whatever is free."""
        check_job(request.job)
        get_policy(request.policy or self.default_policy)
        size, per_node, rack = self.inventory.size, self._per_node, self._per_rack_npus
        if request.npus < 1:
            raise InvalidArgumentError(
                f"a job asks for at least 1 NPU, got {request.npus}", field="npus"
            )
        if request.npus > size:
            raise OutOfRangeError(
                f"{request.npus} NPUs asked for; this supernode has {size}",
                field="npus",
                reason="TOO_MANY_NPUS",
            )
        if request.whole_nodes and request.npus % per_node:
            raise InvalidArgumentError(
                f"whole nodes: {request.npus} NPUs is not a multiple of {per_node} per node",
                field="npus",
            )
        if request.same_rack and request.npus > rack:
            raise OutOfRangeError(
                f"same rack: {request.npus} NPUs asked for; a rack has at most {rack}",
                field="npus",
                reason="TOO_MANY_NPUS",
            )

    def allocate(self, request: JobRequest, now_ns: int) -> Allocation:
        self.check(request)
        if request.job in self._jobs:
            held = len(self._jobs[request.job].npus)
            raise PreconditionError(
                f"job {quote(request.job)} already holds {held} NPUs; release it first",
                field="job",
                subject=request.job,
                reason="JOB_EXISTS",
            )
        policy = get_policy(request.policy or self.default_policy)
        chosen = place(
            policy,
            self.view(),
            request.npus,
            whole_nodes=request.whole_nodes,
            same_rack=request.same_rack,
        )
        if chosen is None:
            raise self._no_room(request)
        for npu in chosen:
            self._take(npu, request.job)
        allocation = Allocation(
            request=request,
            policy=policy.name,
            npus=tuple(self._sorted(chosen)),
            allocated_ns=now_ns,
        )
        self._jobs[request.job] = allocation
        return allocation

    def _no_room(self, request: JobRequest) -> CapacityError:
        shape = [
            label
            for label, on in (("whole nodes", request.whole_nodes), ("one rack", request.same_rack))
            if on
        ]
        held = f"{len(self._spares)} spare and {len(self._failed)} failed NPUs held back"
        return CapacityError(
            f"no room for job {quote(request.job)}"
            + (f" ({', '.join(shape)})" if shape else "")
            + f" [{held}]",
            request.npus,
            self.free_count,
            unit="NPUs",
            field="npus",
            subject=request.job,
            reason="NO_ROOM",
        )

    def release(self, job: str) -> Allocation:
        allocation = self.get(job)
        del self._jobs[job]
        for npu in allocation.npus:
            del self._owner[npu]
            if npu not in self._failed:
                self._free[self.inventory.node_of(npu)].add(npu)
        self._refill()
        return allocation

    # --- faults and replacement ----------------------------------------------------------------

    def targets(self, *, npu: str = "", node: str = "") -> list[str]:
        """The NPUs named by exactly one of an NPU id and a node id."""
        if bool(npu) == bool(node):
            raise InvalidArgumentError("name exactly one of an NPU and a node", field="target")
        if npu:
            self.inventory.node_of(npu)
            return [npu]
        return list(self.inventory.node(node).npus)

    def mark_failed(self, npus: Iterable[str]) -> list[str]:
        """Take NPUs out of service; the jobs holding any of them (they keep them, flagged)."""
        affected: list[str] = []
        for npu in npus:
            node = self.inventory.node_of(npu)
            self._failed.add(npu)
            self._spares.discard(npu)
            self._free[node].discard(npu)
            job = self._owner.get(npu)
            if job is not None:
                held = self._jobs[job]
                self._jobs[job] = dc_replace(held, failed=held.failed | {npu})
                if job not in affected:
                    affected.append(job)
        self._refill()
        return affected

    def mark_healthy(self, npus: Iterable[str]) -> list[str]:
        """Back in service: free again, or no longer flagged in the job that holds it."""
        back: list[str] = []
        for npu in npus:
            node = self.inventory.node_of(npu)
            if npu not in self._failed:
                continue
            self._failed.discard(npu)
            back.append(npu)
            job = self._owner.get(npu)
            if job is None:
                self._free[node].add(npu)
            else:
                held = self._jobs[job]
                self._jobs[job] = dc_replace(held, failed=held.failed - {npu})
        self._refill()
        return back

    def replace(
        self, job: str, *, npu: str = "", node: str = ""
    ) -> tuple[Allocation, list[Replacement]]:
        """Swap one NPU of a job, or all of its NPUs in one node, for spares: all or nothing. A
        failed NPU replaced stays out of service; a healthy one goes back to the free NPUs."""
        allocation = self.get(job)
        named = self.targets(npu=npu, node=node)
        old = [p for p in named if self._owner.get(p) == job]
        if not old:
            where = npu or f"node {node}"
            raise PreconditionError(
                f"job {quote(job)} holds no NPU on {where}",
                field="npu" if npu else "node",
                subject=npu or node,
                reason="NOT_IN_JOB",
            )
        if len(old) > len(self._spares):
            raise CapacityError(
                f"spare NPUs to replace {len(old)} of job {quote(job)}: too few left "
                f"(target {self._spares.target}; SetSpares reserves more as NPUs come free)",
                len(old),
                len(self._spares),
                unit="spare NPUs",
                subject=job,
                reason="NO_SPARES",
            )
        used = {self.inventory.node_of(p) for p, j in self._owner.items() if j == job}
        swaps = [Replacement(old=p, new=self._spares.take_nearest(p, used)) for p in old]
        for swap in swaps:
            self._spares.discard(swap.new)
            del self._owner[swap.old]
            if swap.old not in self._failed:
                self._free[self.inventory.node_of(swap.old)].add(swap.old)
            self._owner[swap.new] = job
        mapping = {s.old: s.new for s in swaps}
        allocation = dc_replace(
            allocation,
            npus=tuple(self._sorted(mapping.get(p, p) for p in allocation.npus)),
            failed=allocation.failed - set(mapping),
        )
        self._jobs[job] = allocation
        self._refill()
        return allocation, swaps

    # --- spares --------------------------------------------------------------------------------

    def set_spares(self, count: int) -> None:
        if count < 0:
            raise InvalidArgumentError(f"spares must be >= 0, got {count}", field="count")
        available = len(self._spares) + self.free_count
        if count > available:
            raise CapacityError(
                "spare NPUs to reserve",
                count,
                available,
                unit="NPUs (free or spare)",
                field="count",
                reason="NO_ROOM",
            )
        self._spares.retarget(count)

    def _refill(self) -> None:
        self._spares.refill()

    # --- helpers -------------------------------------------------------------------------------

    def _take(self, npu: str, job: str) -> None:
        self._free[self.inventory.node_of(npu)].discard(npu)
        self._owner[npu] = job

    def _sorted(self, npus: Iterable[str]) -> list[str]:
        return sorted(npus, key=self._order.__getitem__)
