"""Fault ids, typed: one family per owner, one parser, and `str()` giving back the same text.

A fault id is text on the wire, in `cmemu fault ls` and in scenario results; its family prefix
says who owns the fault and so who clears it (emulator/client/faults.py dispatches on `family`):

    dev:<device>              a device's device-down
    dev:<device>:<kind>       a device's fault of a kind (crash, hang, sdc, service-down...)
    node:<node>               node-power-off: every device of the node crashed
    node:<node>:<kind>        a node-wide fault made of its NPUs' (thermal-throttle)
    rack:<rack>               rack-power-off: every device of the rack's nodes crashed
    proc:<process>:<kind>     process-kill / process-pause of a procs-launcher process
    ctr:<target>:<kind>       a container fault under the Docker engine
    ckpt:<job>:<step>:<pools> checkpoint-corrupt: the pools (comma-separated) whose copies of
                              the job's step manifest are corrupt
    rdma:<id>                 a gateway's RDMA-plane fault, by the gateway's own id
    broker                    broker-outage
    <id>                      the fabric's own (`f7`): no prefix, no colon

Ids come from users (`cmemu fault rm`), so parsing refuses a malformed one of a known family,
or an unknown family, with InvalidArgumentError naming the id; nothing else splits fault ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from cmemu.emulator.model.errors import InvalidArgumentError, quote

DEVICE_DOWN = "device-down"  # a `dev:<device>` id's kind
_KIND = re.compile(r"[a-z][a-z0-9-]*")
_STEP = re.compile(r"[1-9][0-9]*")


class Family(StrEnum):
    """Who owns a fault, by its id's prefix."""

    DEVICE = "dev"
    NODE = "node"
    RACK = "rack"
    PROCESS = "proc"
    CONTAINER = "ctr"
    CHECKPOINT = "ckpt"
    RDMA = "rdma"
    BROKER = "broker"
    FABRIC = ""


SHAPES = {
    Family.DEVICE: "dev:<device>[:<kind>]",
    Family.NODE: "node:<node>[:<kind>]",
    Family.RACK: "rack:<rack>",
    Family.PROCESS: "proc:<process>:<kind>",
    Family.CONTAINER: "ctr:<target>:<kind>",
    Family.CHECKPOINT: "ckpt:<job>:<step>:<pool>[,<pool>...]",
    Family.RDMA: "rdma:<gateway fault id>",
    Family.BROKER: "broker",
    Family.FABRIC: "<fabric fault id> (f7)",
}


def _bad(text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"bad fault id {quote(text)}: {why}",
        field="id",
        subject=text,
        reason="INVALID_FAULT_ID",
    )


@dataclass(frozen=True, kw_only=True)
class FaultId:
    """One fault's id: its family and its parts. `subject` is what the family's owner knows
    the fault by (a device, node, rack, process, container target, training job, the
    gateway's or the fabric's own id); `kind` the fault kind where the id names one ("" for a
    `dev:` device-down and a `node:` power-off); `step` and `pools` a checkpoint's."""

    family: Family
    subject: str = ""
    kind: str = ""
    step: int = 0
    pools: tuple[str, ...] = ()

    # --- building --------------------------------------------------------------------------

    @classmethod
    def device(cls, device: str, kind: str = DEVICE_DOWN) -> FaultId:
        return cls(family=Family.DEVICE, subject=device, kind="" if kind == DEVICE_DOWN else kind)

    @classmethod
    def node(cls, node: str, kind: str = "") -> FaultId:
        return cls(family=Family.NODE, subject=node, kind=kind)

    @classmethod
    def rack(cls, rack: str) -> FaultId:
        return cls(family=Family.RACK, subject=rack)

    @classmethod
    def process(cls, process: str, kind: str) -> FaultId:
        return cls(family=Family.PROCESS, subject=process, kind=kind)

    @classmethod
    def container(cls, target: str, kind: str) -> FaultId:
        return cls(family=Family.CONTAINER, subject=target, kind=kind)

    @classmethod
    def checkpoint(cls, job: str, step: int, pools: tuple[str, ...]) -> FaultId:
        return cls(family=Family.CHECKPOINT, subject=job, step=step, pools=pools)

    @classmethod
    def rdma(cls, own: str) -> FaultId:
        return cls(family=Family.RDMA, subject=own)

    @classmethod
    def broker(cls) -> FaultId:
        return cls(family=Family.BROKER)

    @classmethod
    def fabric(cls, own: str) -> FaultId:
        return cls(family=Family.FABRIC, subject=own)

    # --- reading ---------------------------------------------------------------------------

    @property
    def device_kind(self) -> str:
        """A `dev:` id's device kind: its kind, or device-down when it names none."""
        return self.kind or DEVICE_DOWN

    def __str__(self) -> str:
        f = self.family
        if f is Family.FABRIC:
            return self.subject
        if f is Family.BROKER:
            return f.value
        if f is Family.CHECKPOINT:
            return f"{f.value}:{self.subject}:{self.step}:{','.join(self.pools)}"
        return f"{f.value}:{self.subject}" + (f":{self.kind}" if self.kind else "")

    @classmethod
    def parse(cls, text: str) -> FaultId:
        """The id `text` names; InvalidArgumentError (INVALID_FAULT_ID, naming it) when it is
        empty, of no family, or not of its family's shape."""
        if not text:
            raise _bad(text, "it is empty")
        if text != text.strip() or any(c.isspace() for c in text):
            raise _bad(text, "a fault id holds no spaces")
        prefix, colon, rest = text.partition(":")
        if not colon:
            return cls.broker() if text == Family.BROKER.value else cls.fabric(text)
        try:
            family = Family(prefix)
        except ValueError:
            raise _bad(
                text, f"no fault family {quote(prefix)} (known: {', '.join(_prefixes())})"
            ) from None
        made = _PARSERS.get(family, _whole)(family, rest, text)
        if str(made) != text:  # a part that would not read back: refuse, never rewrite
            raise _bad(text, f"a {family.value} id is {SHAPES[family]}")
        return made


def _prefixes() -> list[str]:
    return [f.value for f in Family if f not in (Family.FABRIC, Family.BROKER)]


def _shape(text: str, family: Family) -> InvalidArgumentError:
    return _bad(text, f"a {family.value} id is {SHAPES[family]}")


def _kind(text: str, family: Family, kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise _bad(text, f"{quote(kind)} is no fault kind name ({SHAPES[family]})")
    return kind


def _target_and_kind(family: Family, rest: str, text: str) -> FaultId:
    """dev:, node: (kind optional, after the first colon: their subjects hold none)."""
    subject, colon, kind = rest.partition(":")
    if not subject or (colon and not kind):
        raise _shape(text, family)
    return FaultId(family=family, subject=subject, kind=_kind(text, family, kind) if kind else "")


def _then_kind(family: Family, rest: str, text: str) -> FaultId:
    """proc:, ctr: (kind required, after the last colon)."""
    subject, colon, kind = rest.rpartition(":")
    if not colon or not subject or not kind:
        raise _shape(text, family)
    return FaultId(family=family, subject=subject, kind=_kind(text, family, kind))


def _whole(family: Family, rest: str, text: str) -> FaultId:
    """rack:, rdma: (one part, no colon in it); broker: (no part at all)."""
    if family is Family.BROKER or not rest or ":" in rest:
        raise _shape(text, family)
    return FaultId(family=family, subject=rest)


def _checkpoint(family: Family, rest: str, text: str) -> FaultId:
    parts = rest.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise _shape(text, family)
    job, step, pools = parts
    if not _STEP.fullmatch(step):
        raise _bad(text, f"a checkpoint's step is a whole number from 1, not {quote(step)}")
    names = tuple(pools.split(","))
    if not all(names):
        raise _bad(text, "its pools are comma-separated device ids, none empty")
    return FaultId.checkpoint(job, int(step), names)


_PARSERS = {
    Family.DEVICE: _target_and_kind,
    Family.NODE: _target_and_kind,
    Family.PROCESS: _then_kind,
    Family.CONTAINER: _then_kind,
    Family.CHECKPOINT: _checkpoint,
}
