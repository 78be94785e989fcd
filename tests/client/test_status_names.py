"""A status read back by a typed client keeps its code's name (emulator/client/status.py
`code_name`), so the CLI and the chaos notes say what the server said, also for a code that has
no error class of its own (UNIMPLEMENTED comes back as an InternalError)."""

from __future__ import annotations

import grpc

from cmemu.emulator.client.status import code_name, error_details, error_from
from cmemu.emulator.model.errors import (
    CODE_OF,
    CODES,
    AddressError,
    AddressInUseError,
    CapacityError,
    DataLossError,
    DeadlineExceededError,
    EmulatorError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnavailableError,
    UnknownNameError,
    error_line,
)
from cmemu.services.rpc import RemoteError, status_line


def _status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details, debug_error_string=""
    )


def test_a_code_without_a_class_keeps_its_name() -> None:
    error = error_from(_status(grpc.StatusCode.UNIMPLEMENTED, "no such method"))
    assert isinstance(error, InternalError) and code_name(error) == "UNIMPLEMENTED"
    assert error_details(error).code is grpc.StatusCode.UNIMPLEMENTED
    assert status_line(error) == "UNIMPLEMENTED: no such method"
    relayed = RemoteError.from_error(error, "scheduler")
    assert relayed.code is grpc.StatusCode.UNIMPLEMENTED
    assert str(relayed) == "scheduler: no such method"


def test_an_error_raised_here_names_its_class_status() -> None:
    assert code_name(InternalError("a bug")) == "INTERNAL"  # not read back: its class's
    missing = NotFoundError("no device 'x'", field="id", subject="x", reason="DEVICE_NOT_FOUND")
    details = error_details(missing)
    assert (details.code, details.reason) == (grpc.StatusCode.NOT_FOUND, "DEVICE_NOT_FOUND")
    assert details.metadata == {"field": "id", "id": "x"}


def test_a_server_that_does_not_answer_is_unavailable_and_retryable() -> None:
    gone = error_from(_status(grpc.StatusCode.UNAVAILABLE, "failed to connect"))
    assert isinstance(gone, UnavailableError) and gone.reason == "PEER_UNREACHABLE"
    assert code_name(gone) == "UNAVAILABLE" and gone.retry_after_s is not None
    assert status_line(gone) == "UNAVAILABLE: failed to connect"


def test_the_domain_names_every_error_s_code_as_its_status_does() -> None:
    """model/errors.py's error_line (what an engine's events say, wire-free) and status_line
    agree for every error class, a subclass, a code read back without a class, and a bug."""
    errors: list[BaseException] = [
        EmulatorError("base"),
        InvalidArgumentError("bad"),
        NotFoundError("none"),
        UnknownNameError("preset", "p", ["cm-mini"]),
        OutOfRangeError("far"),
        CapacityError("pool", 2, 1),
        PreconditionError("not yet"),
        UnavailableError("down"),
        AddressInUseError("n00-npu0", "127.0.0.1:1"),
        AddressError("n00-npu0", "nowhere:1", "no such host"),
        DataLossError("fails its CRC-32", reason="CHECKSUM_MISMATCH"),
        DeadlineExceededError("late"),
        UnauthenticatedError("who"),
        PermissionDeniedError("no"),
        InternalError("a bug"),
        error_from(_status(grpc.StatusCode.UNIMPLEMENTED, "no such method")),
        ValueError("not a manifest"),
    ]
    assert {type(e) for e in errors} >= set(CODE_OF)
    assert [error_line(e) for e in errors] == [status_line(e) for e in errors]
    assert error_line(errors[10]) == "DATA_LOSS: fails its CRC-32"
    assert {c.name for c in grpc.StatusCode} - {"OK"} == CODES
