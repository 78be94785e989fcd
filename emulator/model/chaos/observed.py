"""What the runner saw, as plain records: its own injections, the manager's incidents, the
workloads' isolation and restore events, the requests of the background load, the EMS objects
and the training jobs. The verdict and the timeline are computed from these alone, so they are
tested without a running emulator. Instants are emulated nanoseconds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Injection:
    label: str  # the step id (#N for a repeat)
    kind: str
    target: str  # as given to the fault kind ("" for none)
    devices: tuple[str, ...]  # the devices it takes down (a node's, a die's NPU), for matching
    at_ns: int
    planned_ns: int = 0  # when the schedule said (the runner's clock; at_ns is the authority's)
    cleared_ns: int | None = None
    fault_id: str = ""
    error: str = ""  # the injection itself failed (its status and message)
    tolerated: bool = False  # its step says the workload rides it out (held to its SLO throughout)


@dataclass(frozen=True, kw_only=True)
class IncidentRecord:
    """cmemu.v1.Incident, as ClusterManager/ListIncidents returns it."""

    id: str
    device: str
    detected_by: str = ""
    state: str = ""
    fault_ns: int = 0
    detected_ns: int = 0
    isolated_ns: int = 0
    replaced_ns: int = 0
    restored_ns: int = 0
    jobs: tuple[str, ...] = ()
    replacements: tuple[str, ...] = ()
    detail: str = ""


CORRUPT_CHECKPOINT = "corrupt-checkpoint"


@dataclass(frozen=True, kw_only=True)
class WorkloadEvent:
    """A workload's own report: `isolated`, `restored` or `failed` (a deployment's status, a
    training job's), with the NPUs it concerned when known; or a training job's restore that
    found its latest checkpoint corrupt (CORRUPT_CHECKPOINT: the data path's own detection)."""

    at_ns: int
    workload: str
    what: str
    npus: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RequestSample:
    """One request of the background load."""

    workload: str
    ok: bool
    done_ns: int  # emulated instant it ended (its last token, or its failure)
    received_ns: int = 0  # emulated instant its reply reached the client: the pacing's lag
    tpot_ms: float = 0.0
    ttft_ms: float = 0.0
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class TrainingRecord:
    name: str
    state: str
    step_at_start: int
    step: int
    restarts: int = 0
    steps_lost: int = 0
    goodput: float = 0.0
    last_failure_ns: int = 0
    last_restored_ns: int = 0


@dataclass(kw_only=True)
class Observations:
    start_ns: int  # the workloads were up
    end_ns: int = 0
    loaded: tuple[str, ...] = ()  # the serving workloads with a background load
    jobs: tuple[str, ...] = ()  # the training workloads
    injections: list[Injection] = field(default_factory=list)
    incidents: list[IncidentRecord] = field(default_factory=list)
    events: list[WorkloadEvent] = field(default_factory=list)
    requests: list[RequestSample] = field(default_factory=list)
    dropped_requests: int = 0  # the router's requests_dropped (must stay 0)
    objects: int = 0
    lost_objects: int | None = None
    training: list[TrainingRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be observed, and why
    # the steady-state hypothesis before the first fault: when it was checked, the incidents
    # open then (of any age), and why the run injected nothing when it did not hold
    steady_ns: int | None = None
    open_before: list[IncidentRecord] = field(default_factory=list)
    halted: str = ""
    # an abort condition crossed (emulator/model/chaos/abort.py): which, and when
    aborted: str = ""
    aborted_ns: int | None = None
