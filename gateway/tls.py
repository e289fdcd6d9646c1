"""TLS on the gateway's listener: one context per gateway process, reloaded in place.

Every route shares one port, so one server context serves them all: aiohttp's routes, the fast
path (:mod:`gateway.fast`) and the watchers' own protocols (:mod:`gateway.door`) read and write
through the TLS transport the listening site (:class:`gateway.accept.AcceptSite`) gives them.

Rotation: :meth:`Certificates.reload` loads the files again into the same
:class:`ssl.SSLContext`. OpenSSL copies a context's certificate and key into each connection
when the connection is made, so connections already open go on with theirs and new
handshakes get the new pair: nothing is dropped. A reload happens when the files change (their
identity is read every :data:`WATCH_S`; cert-manager and Kubernetes swap a secret volume's
files through a symlink, which changes it) and on ``SIGHUP``. Files that do not load (half
written, a key that does not match the certificate) leave the context as it was, logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field

__all__ = ["WATCH_S", "Certificates", "TlsError", "subject"]

log = logging.getLogger("evq.tls")

WATCH_S = 2.0  # how often the certificate files' identity is read


class TlsError(ValueError):
    """The certificate or key does not load (missing, unreadable, malformed, mismatched)."""


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)  # follows symlinks: a swapped secret volume changes the target
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return context


def _load(context: ssl.SSLContext, cert: str, key: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise TlsError(f"TLS: no such file: {exc.filename}") from None
    except (ssl.SSLError, OSError) as exc:  # the message names the files, never their content
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        raise TlsError(
            f"TLS: {cert} and {key} do not load as a certificate and its key ({reason})"
        ) from None


@dataclass
class Certificates:
    """The server context of ``cert`` (PEM, the chain) and ``key`` (PEM).

    Raises:
        TlsError: the files do not load (at start; later, a reload keeps the old pair).
    """

    cert: str
    key: str
    context: ssl.SSLContext = field(init=False)
    loads: int = field(default=0, init=False)  # successful loads, the first included
    _stamps: tuple[tuple[int, int, int], ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        self.context = _server_context()
        self._stamps = self._read_stamps()
        _load(self.context, self.cert, self.key)
        self.loads = 1

    def _read_stamps(self) -> tuple[tuple[int, int, int], ...]:
        try:
            return (_stamp(self.cert), _stamp(self.key))
        except OSError:
            return ()

    def changed(self) -> bool:
        """Whether the files are not the ones last loaded (or tried)."""
        return self._read_stamps() != self._stamps

    def reload(self) -> bool:
        """Load the files again; True if the new pair is in use. A pair that does not load is
        first tried on a context of its own, so the one in use never holds half of it."""
        self._stamps = self._read_stamps()
        try:
            _load(_server_context(), self.cert, self.key)
            _load(self.context, self.cert, self.key)
        except TlsError as exc:
            log.error("certificate not reloaded, the previous one stays in use: %s", exc)
            return False
        self.loads += 1
        log.info("certificate reloaded from %s", self.cert)
        return True

    async def watch(self, every_s: float = WATCH_S) -> None:
        """Reload whenever the files change (runs until cancelled)."""
        while True:
            await asyncio.sleep(every_s)
            if self.changed():
                self.reload()


def subject(cert: str) -> str:
    """The common name of the first certificate in the PEM file ``cert`` ("" if none)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        first = x509.load_pem_x509_certificate(open(cert, "rb").read())  # noqa: SIM115
    except (OSError, ValueError):
        return ""
    names = first.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""
