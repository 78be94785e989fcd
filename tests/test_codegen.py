"""The committed wire code is exactly what protos/ generates."""

from __future__ import annotations

from cmemu.emulator.cli import codegen


def test_generated_code_has_not_drifted_from_protos() -> None:
    assert codegen.drift() == [], "run: python -m cmemu.emulator.cli.codegen"


def test_every_proto_has_its_four_generated_modules() -> None:
    committed = set(codegen._committed())
    for proto in codegen._protos():
        for suffix in codegen.GENERATED_SUFFIXES:
            assert f"{proto.stem}{suffix}" in committed
