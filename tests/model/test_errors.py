"""Errors quote their inputs short: a request value is never echoed whole."""

from __future__ import annotations

from cmemu.emulator.model.errors import QUOTE_MAX, EmulatorError, UnknownNameError, quote, shorten


def test_quote_and_shorten_keep_short_text_and_cut_long_text() -> None:
    assert quote("n00-npu3") == "'n00-npu3'"
    assert shorten("n00-npu3") == "n00-npu3"
    long = "a" * 100_000
    cut = quote(long)
    assert len(cut) < QUOTE_MAX + 40 and cut.startswith("'aaa") and "100000 characters" in cut
    assert len(shorten(long, 10)) < 50


def test_errors_keep_their_subject_short() -> None:
    error = EmulatorError("x", subject="s" * 50_000)
    assert error.subject is not None and len(error.subject) < QUOTE_MAX + 40
    error = EmulatorError("x")
    error.annotate(subject="t" * 50_000)
    assert error.subject is not None and len(error.subject) < QUOTE_MAX + 40


def test_an_unknown_name_is_quoted_short() -> None:
    error = UnknownNameError("preset", "p" * 50_000, ["cm384", "cm-mini"])
    assert len(str(error)) < 400
