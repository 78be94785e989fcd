"""The keys file through a launcher: `cmemu up --token-file` reads a token or a keys file, and a
child process (procs, compose: `$CMEMU_TOKEN_FILE`) receives the same tenants."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime.security import TOKEN_ENV, Security, read_keys, read_token

KEYS = """version = 1
admin = "admin-key-0123456789abcdef"

[tenants.acme]
key = "acme-key-0123456789abcdef"
priority = "near-line"
tokens_per_min = 1000.0
"""


def test_a_keys_file_reaches_a_child_process(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS)
    keys = read_keys(path)
    assert read_token(path) == keys.admin == "admin-key-0123456789abcdef"
    env = Security(token=keys.admin, keys=keys).env(tmp_path / "child")
    written = Path(env[TOKEN_ENV])
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    child = Security.from_env(env)
    assert child.token == keys.admin and child.keys == keys
    served = child.server().keys
    assert served is not None and served.names() == ["default", "acme"]


def test_a_token_file_is_still_one_tenant(tmp_path: Path) -> None:
    path = tmp_path / "token.txt"
    path.write_text("plain-token-0123\n")
    env = Security(token=read_token(path)).env(tmp_path / "child")
    assert Path(env[TOKEN_ENV]).read_text() == "plain-token-0123\n"
    served = Security.from_env(env).server().keys
    assert served is not None and served.names() == ["default"]


def test_a_bad_keys_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('version = 1\nadmin = "short"\n')
    with pytest.raises(InvalidArgumentError, match=str(path)):
        read_keys(path)
