"""A fault kind's typed parameters <-> the `oneof params` of its fault message, by field name.

Each kind's parameters are one frozen dataclass, in the kind's module (a device's, the fabric's or
the gateway's KINDS, or the client's faultkinds/), and one message of the same name, fields and
types (protos/cmemu/v1/faultparams.proto), carried in the fault message's oneof field named after
the kind (`hbm-ecc` -> `hbm_ecc`). One conversion serves every fault message (Device's
FaultState, FabricFault, GatewayFault) at both ends: the client packs what it typed, the
servicer unpacks what arrived. Unpacking validates once, in the domain (`params_from`: each
field's range and the dataclass's own `check`), so a bad value is an InvalidArgumentError naming
the field (`params.factor`) and becomes INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from cmemu.emulator.model.errors import InvalidArgumentError, quote
from cmemu.emulator.model.faults.params import params_from, values

ONEOF = "params"


class FaultMessage(Protocol):
    """What the fault messages share: a kind and a `oneof params`."""

    @property
    def kind(self) -> str: ...

    def WhichOneof(self, oneof_group: Any) -> Any: ...


M = TypeVar("M")


def field_of(kind: str) -> str:
    """The oneof field a kind's parameters travel in."""
    return kind.replace("-", "_")


def pack(message: M, kind: str, params: object | None) -> M:
    """`message` with `params` (a params dataclass, or None for none) in `kind`'s oneof field,
    every field set: the receiver sees what was typed, defaults included."""
    if params is None:
        return message
    sub = getattr(message, field_of(kind))
    sub.SetInParent()  # a kind without parameters still says which it is
    wire = sub.DESCRIPTOR.fields_by_name
    for name, value in values(params).items():
        if name not in wire:  # a params class that drifted from its message: never sent short
            raise TypeError(f"{type(params).__name__}.{name} has no field in {sub.DESCRIPTOR.name}")
        setattr(sub, name, value)
    return message


def raw_params(message: FaultMessage) -> dict[str, object]:
    """The fields the sender set in the message's oneof, by name ({} when none is set)."""
    which = message.WhichOneof(ONEOF)
    if which is None:
        return {}
    return {f.name: value for f, value in getattr(message, which).ListFields()}


def params_text(message: FaultMessage) -> dict[str, str]:
    """The set fields as text (`wipe=true`), for a listing's detail."""
    return {
        name: ("true" if value else "false") if isinstance(value, bool) else f"{value}"
        for name, value in raw_params(message).items()
    }


def unpack(message: FaultMessage, table: Mapping[str, type[Any]]) -> Any | None:
    """The typed parameters of `message.kind` from its oneof; None for a kind `table` does not
    hold (the domain names it an unknown kind). InvalidArgumentError for another kind's oneof
    field, an unknown field, a required field left out or a value out of its range."""
    kind = message.kind
    cls = table.get(kind)
    if cls is None:
        return None
    which = message.WhichOneof(ONEOF)
    expected = field_of(kind)
    if which is not None and which != expected:
        raise InvalidArgumentError(
            f"{kind}: its parameters go in {quote(expected)}, not {quote(which)}",
            field=which,
            subject=kind,
            reason="WRONG_FAULT_PARAMS",
        )
    return params_from(cls, raw_params(message), kind=kind)


_WIRE_TYPES: dict[type[Any], frozenset[int]] = {
    bool: frozenset({FieldDescriptor.TYPE_BOOL}),
    int: frozenset(
        {
            FieldDescriptor.TYPE_INT32,
            FieldDescriptor.TYPE_INT64,
            FieldDescriptor.TYPE_UINT32,
            FieldDescriptor.TYPE_UINT64,
            FieldDescriptor.TYPE_SINT32,
            FieldDescriptor.TYPE_SINT64,
        }
    ),
    float: frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}),
    str: frozenset({FieldDescriptor.TYPE_STRING}),
}
"""The wire types a dataclass field's type may travel as."""
_TYPE_NAMES = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def drift(table: Mapping[str, type[Any]], fault: Descriptor) -> list[str]:
    """How the kinds of `table` and the `oneof params` of the fault message `fault` disagree
    (empty when they agree): a kind without its oneof field or a field without its kind, a
    message not named as the dataclass, a field missing on either side, of an incompatible
    type, repeated, or without presence (a default could not be told from a value)."""
    problems: list[str] = []
    oneof = fault.oneofs_by_name[ONEOF]
    fields = {f.name: f for f in oneof.fields}
    wanted = {field_of(kind): kind for kind in table}
    problems += [f"{fault.name}: no oneof field {name} for {k}" for name, k in wanted.items()
                 if name not in fields]  # fmt: skip
    problems += [f"{fault.name}: oneof field {n} is no kind's" for n in fields if n not in wanted]
    for name, kind in wanted.items():
        message = fields[name].message_type if name in fields else None
        if name in fields and message is None:
            problems.append(f"{fault.name}: oneof field {name} is no message")
        elif message is not None:
            problems += _message_drift(table[kind], message, kind)
    return problems


def _message_drift(cls: type[Any], message: Descriptor, kind: str) -> list[str]:
    where = f"{kind} ({cls.__name__} / {message.name})"
    problems = [] if message.name == cls.__name__ else [f"{where}: named differently"]
    hints = typing.get_type_hints(cls)
    ours = {f.name for f in dataclasses.fields(cls)}
    theirs = {f.name: f for f in message.fields}
    problems += [f"{where}: {n} has no wire field" for n in sorted(ours - set(theirs))]
    problems += [f"{where}: wire field {n} is no parameter" for n in sorted(set(theirs) - ours)]
    for name in sorted(ours & set(theirs)):
        f = theirs[name]
        if f.type not in _WIRE_TYPES.get(hints[name], frozenset()):
            wire = _TYPE_NAMES.get(f.type, str(f.type))
            problems.append(f"{where}: {name} is {hints[name].__name__} but {wire} on the wire")
        if f.is_repeated or not f.has_presence:
            problems.append(f"{where}: {name} must be a single optional field")
    return problems
