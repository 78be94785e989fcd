"""The committed wire code is exactly what protos/ generates."""

from __future__ import annotations

from emulator import codegen


def test_generated_code_has_not_drifted_from_protos() -> None:
    assert codegen.drift() == [], "run: python -m emulator.codegen"


def test_every_proto_has_its_generated_modules() -> None:
    names = {p.stem for p in codegen._protos()}
    assert names == {"ub", "device", "npu", "cpu", "mempool"}
