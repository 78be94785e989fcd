"""A key's checks (model/ems/keys.py check_key): the byte limit counts UTF-8 bytes, not
characters, and the characters a region label cannot hold are refused; each refusal beside the
key that just passes."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.ems.keys import KEY_MAX_BYTES, check_key
from cmemu.emulator.model.errors import InvalidArgumentError

FOUR = "\U0001f600"  # four bytes in UTF-8


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("k" * KEY_MAX_BYTES, True),
        ("k" * (KEY_MAX_BYTES + 1), False),
        (FOUR * (KEY_MAX_BYTES // 4), True),  # 50 characters, 200 bytes
        (FOUR * (KEY_MAX_BYTES // 4) + "k", False),  # 51 characters, 201 bytes
        ("é" * (KEY_MAX_BYTES // 2), True),
        ("é" * (KEY_MAX_BYTES // 2 + 1), False),
        ("", False),
        ("a|b", False),
        ("a\nb", False),
        ("a/b:c", True),
    ],
)
def test_a_key_is_refused_past_the_byte_limit_or_with_a_label_separator(key: str, ok: bool) -> None:
    if ok:
        check_key(key)
    else:
        with pytest.raises(InvalidArgumentError):
            check_key(key)
