"""The cluster manager of a running emulator as a program (or `cmemu manager`) calls it: its
status, its mode, its incidents, as the domain values its engine holds
(emulator/engines/manager/status.py, emulator/model/manager/detector.py). Every failure is the
EmulatorError its status names, the server's message unprefixed."""

from __future__ import annotations

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.engines.manager.status import ManagerStatus, Mode
from cmemu.emulator.model.errors import InternalError, InvalidArgumentError
from cmemu.emulator.model.manager.detector import Incident
from cmemu.emulator.model.topology import ServiceKind
from cmemu.v1 import manager_pb2, manager_pb2_grpc

WIRE_MODE = {
    Mode.ACTIVE: manager_pb2.MANAGER_MODE_ACTIVE,
    Mode.PASSIVE: manager_pb2.MANAGER_MODE_PASSIVE,
}
MODE_OF = {wire: mode for mode, wire in WIRE_MODE.items()}


class ManagerClient:
    """The manager of `clients`' supernode, over its channels (not closed here)."""

    def __init__(self, clients: Clients, *, timeout_s: float | None = None) -> None:
        """`timeout_s`: every call's wall deadline (None: none), for a caller that must go on
        when the service hangs (the chaos runner's status polls)."""
        self._timeout_s = timeout_s
        address = clients.topology.service(ServiceKind.MANAGER).address
        self._stub = manager_pb2_grpc.ClusterManagerStub(clients.channel_to(address))

    async def status(self) -> ManagerStatus:
        request = manager_pb2.GetManagerStatusRequest()
        return _status(await reply_of(None, self._stub.GetStatus(request, timeout=self._timeout_s)))

    async def set_mode(self, mode: Mode) -> ManagerStatus:
        """Active (detect, isolate, replace) or passive (detect and record): the status after."""
        request = manager_pb2.SetModeRequest(mode=WIRE_MODE[mode])
        return _status(await reply_of(None, self._stub.SetMode(request, timeout=self._timeout_s)))

    async def incidents(self, since_ns: int = 0) -> list[Incident]:
        """The incidents detected after `since_ns` (emulated), with their timelines."""
        if since_ns < 0:
            raise InvalidArgumentError(
                f"since must not be negative, got {since_ns}", field="since_ns"
            )
        request = manager_pb2.ListIncidentsRequest(since_ns=since_ns)
        reply = await reply_of(None, self._stub.ListIncidents(request, timeout=self._timeout_s))
        return [_incident(i) for i in reply.incidents]


def _status(m: manager_pb2.ManagerStatus) -> ManagerStatus:
    mode = MODE_OF.get(m.mode)
    if mode is None:
        raise InternalError(f"the manager reports no known mode ({m.mode})")
    return ManagerStatus(
        mode=mode,
        devices_watched=m.devices_watched,
        devices_suspect=m.devices_suspect,
        devices_failed=m.devices_failed,
        heartbeat_interval_s=m.heartbeat_interval_s,
        misses_to_fail=m.misses_to_fail,
        open_incidents=m.open_incidents,
        liveness_streams=m.liveness_streams,
        devices_covered=m.devices_covered,
    )


def _incident(i: manager_pb2.Incident) -> Incident:
    return Incident(
        id=i.id,
        device=i.device,
        detected_by=i.detected_by,
        state=i.state,
        fault_ns=i.fault_ns,
        detected_ns=i.detected_ns,
        isolated_ns=i.isolated_ns,
        replaced_ns=i.replaced_ns,
        restored_ns=i.restored_ns,
        jobs=list(i.jobs),
        replacements=list(i.replacements),
        detail=i.detail,
    )
