"""A private certificate authority for the tests: a CA and the certificates it signs, as PEM
files (what cert-manager or an operator would hand a server), made with ``cryptography``."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["Authority", "Issued"]

NAMES = ("127.0.0.1", "localhost")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Issued:
    """A server certificate and its key, as files."""

    cert: Path
    key: Path
    serial: int


class Authority:
    """A self-signed CA; :attr:`bundle` is its certificate, for clients to verify with."""

    def __init__(self, directory: Path, name: str = "evq test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.bundle = directory / f"{name.replace(' ', '-')}.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str = "server", names: tuple[str, ...] = NAMES) -> Issued:
        """A server certificate for ``names`` (IP addresses or DNS names), written to
        ``stem.crt`` and ``stem.key`` (replaced atomically if they exist, as a rotation)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alt: list[x509.GeneralName] = []
        for n in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        paths = Issued(self.directory / f"{stem}.crt", self.directory / f"{stem}.key", serial)
        for path, data in (
            (paths.key, _key_pem(key)),
            (paths.cert, cert.public_bytes(serialization.Encoding.PEM)),
        ):
            fresh = path.with_name(path.name + ".new")
            fresh.write_bytes(data)
            fresh.replace(path)
        return paths
