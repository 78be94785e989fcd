"""How one emulator run guards itself (DESIGN principle 11), for every launcher alike.

A `Security` value holds the bearer token, the TLS files and whether binding beyond loopback
without a token is accepted (`--insecure`). The servers get its `server()` side (services/auth.py),
every client and every device calling another its `credentials()` side
(emulator/client/credentials.py). A process of `--mode procs` or a container receives it through
its environment: `CMEMU_TOKEN_FILE` (a file holding the token, never the token itself),
`CMEMU_TLS_CERT`, `CMEMU_TLS_KEY`, `CMEMU_TLS_CA`, `CMEMU_INSECURE=1`, and `CMEMU_MQTT_USER`
when the broker wants a login (its password derived from the token: `mqtt_password`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.tenants import Keys, parse_keys, render_keys, single
from cmemu.emulator.runtime.tls import TlsFiles
from cmemu.services.auth import ServerSecurity

TOKEN_ENV = "CMEMU_TOKEN_FILE"
TLS_CERT_ENV = "CMEMU_TLS_CERT"
TLS_KEY_ENV = "CMEMU_TLS_KEY"
TLS_CA_ENV = "CMEMU_TLS_CA"
INSECURE_ENV = "CMEMU_INSECURE"
MQTT_USER_ENV = "CMEMU_MQTT_USER"
MQTT_USER = "cmemu"  # the broker's user when it wants a login (password: mqtt_password)
MQTT_PASSWORD_CONTEXT = b"cmemu mqtt broker login"
TOKEN_BYTES = 32


def mqtt_password(token: str) -> str:
    """The broker's password for an instance with `token`: HMAC-SHA256 of a fixed context under
    the token, hex. Not the token: MQTT crosses its wire without TLS (even with `--tls`), and a
    password read there must open the broker only, never the gRPC services or the OpenAI
    endpoint; every process that holds the token derives it."""
    return hmac.new(token.encode(), MQTT_PASSWORD_CONTEXT, hashlib.sha256).hexdigest()


def new_token() -> str:
    """A random token: 256 bits, URL-safe text."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def read_keys(path: Path) -> Keys:
    """A token file (one token: one tenant, `default`) or a keys file (emulator/model/tenants.py
    documents the format); InvalidArgumentError when it is unreadable or malformed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the token file {path}: {exc}") from exc
    return parse_keys(text, f"token file {path}")


def read_token(path: Path) -> str:
    """The emulator's token in a token or keys file (a keys file's `admin`)."""
    return read_keys(path).admin


def write_secret(path: Path, text: str) -> None:
    """Write `text` readable by its owner only (0600), whatever the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


@dataclass(frozen=True, kw_only=True)
class Security:
    """A launch's security: its token, TLS files, broker user and tenants' keys."""

    token: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None
    insecure: bool = False
    mqtt_user: str | None = None  # the broker wants this user, with mqtt_password(token)
    keys: Keys | None = field(default=None, repr=False)  # tenants of the HTTP endpoint

    def __post_init__(self) -> None:
        if self.keys is not None and self.keys.admin != self.token:
            raise ValueError("a keys file's admin key is the token")

    def mqtt_login(self) -> dict[str, str]:
        """The broker login (EventBus's username and password), when the broker wants one."""
        if self.mqtt_user is None or self.token is None:
            return {}
        return {"username": self.mqtt_user, "password": mqtt_password(self.token)}

    def server(self) -> ServerSecurity:
        keys = self.keys or (single(self.token) if self.token else None)
        if self.tls is None:
            return ServerSecurity(token=self.token, insecure=self.insecure, keys=keys)
        cert, key, _ = self.tls.read()
        return ServerSecurity(
            token=self.token, cert_pem=cert, key_pem=key, insecure=self.insecure, keys=keys
        )

    def credentials(self) -> Credentials:
        ca = self.tls.read()[2] if self.tls is not None else None
        return Credentials(token=self.token, ca_pem=ca)

    def env(self, directory: Path) -> dict[str, str]:
        """The environment that hands this to a child process; the token goes in a file of
        `directory` (0600)."""
        env: dict[str, str] = {}
        if self.token:
            token_file = directory / "token"
            text = render_keys(self.keys) if self.keys is not None else self.token + "\n"
            write_secret(token_file, text)
            env[TOKEN_ENV] = str(token_file)
        if self.tls is not None:
            env |= {
                TLS_CERT_ENV: str(self.tls.cert),
                TLS_KEY_ENV: str(self.tls.key),
                TLS_CA_ENV: str(self.tls.ca),
            }
        if self.insecure:
            env[INSECURE_ENV] = "1"
        if self.mqtt_user is not None:
            env[MQTT_USER_ENV] = self.mqtt_user
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, insecure: bool = False) -> Security:
        """What `cmemu serve` runs with: the variables above (`insecure` also from its flag)."""
        token_file = environ.get(TOKEN_ENV)
        keys = read_keys(Path(token_file)) if token_file else None
        cert, key = environ.get(TLS_CERT_ENV), environ.get(TLS_KEY_ENV)
        if bool(cert) != bool(key):
            raise InvalidArgumentError(f"${TLS_CERT_ENV} and ${TLS_KEY_ENV} go together")
        tls = None
        if cert and key:
            tls = TlsFiles(cert=Path(cert), key=Path(key), ca=Path(environ.get(TLS_CA_ENV) or cert))
        return cls(
            token=keys.admin if keys is not None else None,
            keys=keys,
            tls=tls,
            insecure=insecure or environ.get(INSECURE_ENV, "") not in ("", "0"),
            mqtt_user=environ.get(MQTT_USER_ENV) or None,
        )


NONE = Security()
