"""service-kill and service-hang: the control plane as a fault target (issue 20 item 4). The
target names a supernode-wide service: manager, scheduler, ems, router, gateway or fabric (its
kind, or its id in a multi-supernode launch, `sn1-manager`).

- service-kill: the service's server stops (clients get UNAVAILABLE) and its background work
  stops; cleared (or at the end of its duration) it starts again on the same address.
- service-hang: the server accepts calls and answers none, health included (clients hit their
  deadlines), its background work stopped, until cleared.
- service-slow: every call waits `latency_ms` of emulated time before it is handled, health
  included; its work goes on (in process only).
- service-partition: the service is cut off the network: nothing reaches it (clients hit their
  deadlines, as with a hang) and it reaches nothing, its work going on; the cluster manager sees
  a silent supernode (and, more than `manager.cut_off_share` of it silent at once, suspects
  itself cut off and fails nobody). In process and under Docker (container-disconnect of its
  container); procs share the host's network: refused there.

How depends on the launcher, read from the process table attached to the clients:
- in process (no table, or `inprocess`): through the management path of a device of the
  service's process (the device kind `service-down`, emulator/engines/device/kinds/service_down.py),
  so it works from any client and its duration is kept in emulated time by that process;
- procs: process-kill / process-pause of the service's own process (a killed one is not
  restarted: the supervisor restarts nothing);
- docker: container-kill / container-pause of its container;
- anything else: FAILED_PRECONDITION LAUNCHER_UNSUPPORTED, naming the mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds import container, process
from cmemu.emulator.client.faultkinds.base import (
    CALL_TIMEOUT_S,
    ActiveFault,
    Typed,
    device_fault,
    via,
)
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds.service_down import NAME as DEVICE_KIND
from cmemu.emulator.engines.device.kinds.service_down import ServiceDownParams
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, PreconditionError, quote
from cmemu.emulator.model.faults.params import POSITIVE, NoParams, param
from cmemu.emulator.model.topology import Service, ServiceKind
from cmemu.v1 import device_pb2

# the device that carries a service's fault in process: one per service, so that several
# services may be down at once (a device holds one fault of a kind)
CARRIER = {k: i for i, k in enumerate(ServiceKind)}


@dataclass(frozen=True, kw_only=True)
class ServiceSlowParams:
    latency_ms: float = param(
        help="emulated milliseconds every call to the service waits before it is handled",
        check=POSITIVE,
    )


def service_of(clients: Clients, target: str) -> Service:
    """A service of the topology by kind (`manager`) or id (`sn1-manager`); NOT_FOUND lists
    the ones there are."""
    for s in clients.topology.services:
        if target in (s.id, s.kind.value):
            return s
    names = ", ".join(s.kind.value for s in clients.topology.services)
    raise NotFoundError(
        f"no service {quote(target)} in {clients.topology.preset}; its services: {names}",
        field="target",
        subject=target,
        reason="SERVICE_NOT_FOUND",
    )


def mode_of(clients: Clients) -> str:
    """How the clients' emulator was launched: inprocess (no process table), procs, docker."""
    table = process.tables().get(clients)
    return table.mode if table is not None else "inprocess"


@dataclass(frozen=True, kw_only=True)
class ServiceKindFault(Typed):
    hang: bool = False
    slow: bool = False  # its params say how late (latency_ms): in process only
    partition: bool = False  # cut off: in process and under Docker
    target: str = "a service: manager, scheduler, ems, router, gateway or fabric"

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        service = service_of(clients, target)
        mode = mode_of(clients)
        if self.slow and mode != "inprocess":
            raise PreconditionError(
                f"{self.name} works in process only (a {mode} launch: container-netem delays a "
                "container's traffic under Docker)",
                field="kind",
                subject=self.name,
                reason="LAUNCHER_UNSUPPORTED",
            )
        if self.partition and mode == "procs":
            raise PreconditionError(
                f"{self.name} has no way into a procs launch: its processes share the host's "
                "network (in process, and under Docker as container-disconnect, it does)",
                field="kind",
                subject=self.name,
                reason="LAUNCHER_UNSUPPORTED",
            )
        if mode == "procs":
            kind = process.PAUSE if self.hang else process.KILL
            return await kind.add(clients, service.id, {}, duration_s)
        if mode == "docker":
            name = (
                "container-disconnect"
                if self.partition
                else "container-pause"
                if self.hang
                else "container-kill"
            )
            return await container.KINDS_BY_NAME[name].add(clients, service.id, {}, duration_s)
        if mode != "inprocess":
            raise PreconditionError(
                f"{self.name} has no way into a {mode} launch yet (in process, procs and "
                "docker it does)",
                field="kind",
                subject=self.name,
                reason="LAUNCHER_UNSUPPORTED",
            )
        carrier = clients.topology.devices[CARRIER[service.kind] % len(clients.topology.devices)]
        latency_ms = typed.latency_ms if self.slow else 0.0
        down = ServiceDownParams(
            service=service.kind.value,
            hang=self.hang,
            latency_ms=latency_ms,
            partition=self.partition,
        )
        request = fault_request(DEVICE_KIND, down, for_s=duration_s, device=carrier.id)
        try:
            stored = await via(
                clients, carrier.id, lambda stub: stub.InjectFault(request, timeout=CALL_TIMEOUT_S)
            )
        except EmulatorError as exc:
            if exc.reason != "FAULT_ALREADY_ACTIVE":
                raise
            raise PreconditionError(
                f"the {service.id} service is down already (service-kill, -hang or -slow "
                f"through {carrier.id}); clear that fault first",
                field="target",
                subject=service.id,
                reason="FAULT_ALREADY_ACTIVE",
            ) from None
        fault = device_fault(stored)
        return ActiveFault(
            id=fault.id,
            kind=self.name,
            target=service.id,
            detail=f"through {carrier.id}",
            since_ns=fault.since_ns,
            until_ns=fault.until_ns,
        )


KILL = ServiceKindFault(
    name="service-kill",
    help="stop a control-plane service's server and its work (manager, scheduler, ems, "
    "router, gateway, fabric); cleared: it starts again on its address",
    params=NoParams,
)
HANG = ServiceKindFault(
    name="service-hang",
    help="a control-plane service accepts calls and answers none until cleared",
    params=NoParams,
    hang=True,
)
PARTITION = ServiceKindFault(
    name="service-partition",
    help="a control-plane service is cut off the network until cleared: nothing reaches it "
    "and it reaches nothing, its work going on (in process, and under Docker)",
    params=NoParams,
    partition=True,
)
SLOW = ServiceKindFault(
    name="service-slow",
    help="a control-plane service answers every call latency_ms emulated ms late until "
    "cleared (in process)",
    params=ServiceSlowParams,
    slow=True,
)


def listed(state: device_pb2.FaultState, clients: Clients) -> ActiveFault:
    """A service fault as `cmemu fault ls` shows it: its kind and its service, as it was added,
    not the `service-down` of the device that carries it in process (its id stays the carrier's:
    `cmemu fault rm` takes it)."""
    fault = device_fault(state)
    params = faultparams.params_text(state)
    kind = (
        PARTITION.name
        if params.get("partition") == "true"
        else SLOW.name
        if float(params.get("latency_ms") or 0) > 0
        else HANG.name
        if params.get("hang") == "true"
        else KILL.name
    )
    # its supernode's service of that kind (a carrier is a device of the service's supernode)
    service = next(
        (
            x
            for t in clients.supernodes
            if any(d.id == state.device for d in t.devices)
            for x in t.services
            if x.kind.value == params.get("service")
        ),
        None,
    )
    if service is None:  # a carrier fault added by hand, naming no service of its supernode
        return fault
    return ActiveFault(
        id=fault.id,
        kind=kind,
        target=service.id,
        detail=f"through {state.device}",
        since_ns=fault.since_ns,
        until_ns=fault.until_ns,
    )
