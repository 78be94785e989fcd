"""TLS for the emulator's servers: a CA and a server certificate made for one run (`--tls auto`),
or the user's own (`--tls-cert/--tls-key`, with `--tls-ca`).

The auto certificate names every address the servers bind as a subject alternative name: an IP
SAN for an IP (loopback addresses, or the `--host`), a DNS SAN for a name (compose hostnames).
Every server shares that one certificate; clients, and devices calling each other, verify with
the CA; `grpcurl -cacert CA` works.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cmemu.emulator.model.address import host_of
from cmemu.emulator.model.errors import InvalidArgumentError

if TYPE_CHECKING:  # cryptography loads only when a certificate is made: not at every start
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

VALID_DAYS = 30
CA_NAME = "ca.pem"
CERT_NAME = "server.pem"
KEY_NAME = "server-key.pem"
WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    """A server certificate chain and its key (PEM files), and the CA clients trust."""

    cert: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(cert, key, ca) PEM bytes; InvalidArgumentError naming an unreadable file."""
        out = []
        for path in (self.cert, self.key, self.ca):
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise InvalidArgumentError(f"cannot read TLS file {path}: {exc}") from exc
        return out[0], out[1], out[2]


def hosts_of(addresses: Iterable[str]) -> list[str]:
    """The distinct hosts of "host:port" addresses, in order. A wildcard (0.0.0.0, [::]) is
    reached as loopback, so it names 127.0.0.1 and localhost."""
    hosts: dict[str, None] = {}
    for address in addresses:
        host = host_of(address)
        for h in ("127.0.0.1", "localhost") if host in WILDCARDS else (host,):
            hosts[h] = None
    return list(hosts)


def _san(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)


def make_auto(
    directory: Path, hosts: Iterable[str], *, now: datetime.datetime | None = None
) -> TlsFiles:
    """A fresh CA and one server certificate for `hosts` (IPs and DNS names), written into
    `directory` (the key 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names = [_san(h) for h in dict.fromkeys(hosts)]
    if not names:
        raise InvalidArgumentError("a TLS certificate needs at least one address")
    now = now or datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cmemu run CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cmemu server")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(cert=directory / CERT_NAME, key=directory / KEY_NAME, ca=directory / CA_NAME)
    _write(files.ca, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.key, _pem_key(key), 0o600)
    return files
