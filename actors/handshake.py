"""How the two ends of a connection inside a cluster prove the cluster's secret to each other
without sending it, and agree on keys that encrypt what follows (pure: no I/O).

The data channel (gateway → shard, :mod:`actors.channel`) and a handler runtime's direct
transport (runtime → worker, :mod:`evq.handlers.link`) begin the same way:

1. the listening end (the *server*) sends a challenge: a fresh X25519 public key and whether
   it will encrypt;
2. the connecting end (the *client*) answers with its own fresh X25519 public key and
   ``HMAC(K, "client" | transcript)``;
3. the server checks that proof and answers ``HMAC(K, "server" | transcript)``, which the
   client checks before it believes any reply.

``K`` is derived from the secret; the transcript is the protocol's name, both public keys and
the encryption flag, so a proof is good for one connection only (a recorded one, replayed,
does not match the next server's fresh key), a proof cannot be reflected (the roles differ),
and the flag cannot be changed on the way. With encryption on, both ends derive a key per
direction from the X25519 shared secret (HKDF, salted with ``K``): each frame's body is sealed
with ChaCha20-Poly1305 under a counter nonce, so a frame that is changed, dropped, replayed
or reordered fails to open and the connection is dropped. The keys are ephemeral: the secret
alone does not open a recorded session.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # cryptography (the server extra) is imported on first use: the base
    # install (the client) imports the channel's module without it
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

__all__ = [
    "PROTOCOL",
    "Client",
    "Refused",
    "Sealed",
    "Server",
    "fingerprint",
    "on_loopback",
]

PROTOCOL = b"evq-link/1"
KEY_BYTES = 32
MIN_SECRET_CHARS = 16  # a cluster secret's least length (gateway settings, shard nodes)
_NONCE = struct.Struct("<Q4x")  # 12 bytes: a frame counter


class Refused(ConnectionError):
    """The other end did not prove the secret (wrong, replayed or missing credential), or a
    sealed frame did not open."""


def on_loopback(*ends: Any) -> bool:
    """Whether every end (a socket address, ``(host, port, …)``) is on loopback: the only
    case where a connection may go unsealed."""
    try:
        return bool(ends) and all(ipaddress.ip_address(end[0]).is_loopback for end in ends)
    except (ValueError, TypeError, IndexError):
        return False


def _auth_key(secret: str | bytes) -> bytes:
    raw = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(raw, PROTOCOL + b" auth", hashlib.sha256).digest()


def fingerprint(secret: str | bytes) -> str:
    """What a gateway shows a shard (through Ray) to learn whether they share the secret: a
    one-way function of it, of no use on a connection (whose proofs use another key)."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(raw, PROTOCOL + b" fingerprint", hashlib.sha256).hexdigest()


def _transcript(server_key: bytes, client_key: bytes, encrypt: bool) -> bytes:
    return PROTOCOL + server_key + client_key + (b"\x01" if encrypt else b"\x00")


def _proof(key: bytes, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(key, role + transcript, hashlib.sha256).digest()


def _ephemeral(encrypt: bool) -> tuple[X25519PrivateKey | None, bytes]:
    """This end's fresh key pair, or, without encryption, a fresh 32-byte nonce in its place
    (the proofs need only freshness: cryptography, ~16 MiB of a process, stays unloaded)."""
    if not encrypt:
        return None, os.urandom(32)
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    private = X25519PrivateKey.generate()
    return private, _public(private)


def _public(private: X25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _session(
    private: X25519PrivateKey, peer: bytes, key: bytes, transcript: bytes
) -> tuple[bytes, bytes]:
    """(client → server key, server → client key)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer))
    except ValueError:
        raise Refused("a malformed key exchange") from None
    okm = HKDF(
        algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=key, info=PROTOCOL + transcript
    ).derive(shared)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


class Sealed:
    """One direction's frames, sealed (or opened) in order under counter nonces."""

    __slots__ = ("_aead", "_count")

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        self._aead: Any = ChaCha20Poly1305(key)
        self._count = 0

    def seal(self, body: bytes) -> bytes:
        nonce = _NONCE.pack(self._count)
        self._count += 1
        return self._aead.encrypt(nonce, body, None)

    def open(self, body: bytes) -> bytes:
        """Raises: Refused: the frame was changed, replayed, reordered or is not ours."""
        from cryptography.exceptions import InvalidTag

        nonce = _NONCE.pack(self._count)
        try:
            plain = self._aead.decrypt(nonce, body, None)
        except InvalidTag:
            raise Refused("a sealed frame did not open (changed, replayed or reordered)") from None
        self._count += 1
        return plain


@dataclass
class Server:
    """The listening end of one connection's handshake."""

    secret: str | bytes
    encrypt: bool
    _private: X25519PrivateKey | None = field(default=None, init=False)
    public: bytes = field(default=b"", init=False)  # sent in the challenge

    def __post_init__(self) -> None:
        self._private, self.public = _ephemeral(self.encrypt)

    def accept(self, client_key: bytes, proof: bytes) -> tuple[bytes, Sealed | None, Sealed | None]:
        """Check the client's answer; return (the server's proof, the sealer of what it sends,
        the opener of what it receives) — both None without encryption.

        Raises:
            Refused: the proof is not of this secret and this connection.
        """
        key = _auth_key(self.secret)
        transcript = _transcript(self.public, client_key, self.encrypt)
        if not hmac.compare_digest(_proof(key, b"client", transcript), proof):
            raise Refused("the client's proof is not of this cluster's secret and connection")
        mine = _proof(key, b"server", transcript)
        if not self.encrypt:
            return mine, None, None
        assert self._private is not None
        c2s, s2c = _session(self._private, client_key, key, transcript)
        return mine, Sealed(s2c), Sealed(c2s)


@dataclass
class Client:
    """The connecting end of one connection's handshake."""

    secret: str | bytes
    _private: X25519PrivateKey | None = field(default=None, init=False)
    public: bytes = field(default=b"", init=False)  # sent with the proof (made by answer())
    _transcript: bytes = field(default=b"", init=False)

    def answer(
        self, server_key: bytes, encrypt: bool
    ) -> tuple[bytes, Sealed | None, Sealed | None]:
        """The proof to send for the server's challenge, the sealer of what this end sends and
        the opener of what it receives (both None without encryption). What the server
        answers is believed only after :meth:`confirm`.

        Raises:
            Refused: a malformed key.
        """
        key = _auth_key(self.secret)
        self._private, self.public = _ephemeral(encrypt)
        self._transcript = _transcript(server_key, self.public, encrypt)
        proof = _proof(key, b"client", self._transcript)
        if not encrypt:
            return proof, None, None
        assert self._private is not None
        c2s, s2c = _session(self._private, server_key, key, self._transcript)
        return proof, Sealed(c2s), Sealed(s2c)

    def confirm(self, proof: bytes) -> None:
        """Check the server's proof.

        Raises:
            Refused: the server does not know the secret (or answered another challenge).
        """
        if not self._transcript or not hmac.compare_digest(
            _proof(_auth_key(self.secret), b"server", self._transcript), proof
        ):
            raise Refused("the server's proof is not of this cluster's secret and connection")
