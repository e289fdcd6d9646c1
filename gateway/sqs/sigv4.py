"""AWS Signature Version 4, checked on the server side. Pure: the caller passes the clock.

SQS clients sign every request (``Authorization: AWS4-HMAC-SHA256 Credential=…,
SignedHeaders=…, Signature=…``). With keys configured, :func:`verify` recomputes the
signature from the request as received — canonical request, string to sign, derived key —
and refuses a request that is unsigned, signed with an unknown key or a wrong secret, or
dated more than five minutes away from the server's clock, with SQS's errors.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Mapping
from urllib.parse import quote

from multidict import CIMultiDictProxy, MultiMapping

from gateway.sqs.errors import SqsError

__all__ = ["ALGORITHM", "MAX_SKEW_MS", "Signature", "parse_authorization", "verify"]

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_MS = 5 * 60 * 1000
_DATE_FORMAT = "%Y%m%dT%H%M%SZ"


class Signature:
    """The parts of an ``Authorization`` header."""

    __slots__ = ("access_key", "date", "region", "service", "signature", "signed_headers")

    def __init__(
        self,
        access_key: str,
        date: str,
        region: str,
        service: str,
        signed_headers: list[str],
        signature: str,
    ) -> None:
        self.access_key = access_key
        self.date = date
        self.region = region
        self.service = service
        self.signed_headers = signed_headers
        self.signature = signature

    @property
    def scope(self) -> str:
        """The credential scope: date/region/service/aws4_request."""
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def _incomplete(detail: str) -> SqsError:
    return SqsError("IncompleteSignature", f"The request signature is incomplete: {detail}")


def parse_authorization(header: str) -> Signature:
    """The parts of a SigV4 ``Authorization`` header.

    Raises:
        SqsError: IncompleteSignature when it is not a well-formed SigV4 header.
    """
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _incomplete(f"the algorithm must be {ALGORITHM}")
    parts: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts[key] = value
    missing = [k for k in ("Credential", "SignedHeaders", "Signature") if not parts.get(k)]
    if missing:
        raise _incomplete(f"missing {', '.join(missing)}")
    scope = parts["Credential"].split("/")
    if len(scope) != 5 or scope[4] != "aws4_request" or not all(scope):
        raise _incomplete("Credential must be KEY/DATE/REGION/SERVICE/aws4_request")
    signed = parts["SignedHeaders"].split(";")
    if "host" not in signed:
        raise _incomplete("the host header must be signed")
    return Signature(scope[0], scope[1], scope[2], scope[3], signed, parts["Signature"])


def verify(
    *,
    method: str,
    raw_path: str,
    headers: CIMultiDictProxy[str] | MultiMapping[str],
    body: bytes,
    keys: Mapping[str, str],
    now_ms: int,
) -> Signature:
    """Check the request's signature against ``keys`` (access key → secret key).

    ``raw_path`` is the request target as received (path and query, still percent-encoded).

    Raises:
        SqsError: MissingAuthenticationToken, IncompleteSignature, InvalidClientTokenId,
            SignatureDoesNotMatch (also for a request dated too far from ``now_ms``).
    """
    header = headers.get("Authorization")
    if not header:
        raise SqsError(
            "MissingAuthenticationToken", "Request is missing Authentication Token", status=403
        )
    sig = parse_authorization(header)
    secret = keys.get(sig.access_key)
    if secret is None:
        raise SqsError(
            "InvalidClientTokenId",
            "The security token included in the request is invalid.",
            status=403,
        )
    amz_date = headers.get("X-Amz-Date", "")
    _check_date(amz_date, sig.date, now_ms)
    payload_hash = hashlib.sha256(body).hexdigest()
    claimed = headers.get("X-Amz-Content-SHA256")
    if claimed is not None and claimed != payload_hash:
        raise _mismatch("the x-amz-content-sha256 header is not the SHA-256 of the body")
    canonical = canonical_request(method, raw_path, headers, sig.signed_headers, payload_hash)
    to_sign = "\n".join(
        [ALGORITHM, amz_date, sig.scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = signing_key(secret, sig.date, sig.region, sig.service)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, sig.signature):
        raise _mismatch()
    return sig


def _mismatch(detail: str = "") -> SqsError:
    message = (
        "The request signature we calculated does not match the signature you provided. "
        "Check your AWS Secret Access Key and signing method."
    )
    return SqsError("SignatureDoesNotMatch", f"{message} {detail}".strip(), status=403)


def _check_date(amz_date: str, scope_date: str, now_ms: int) -> None:
    try:
        when_ms = calendar.timegm(time.strptime(amz_date, _DATE_FORMAT)) * 1000
    except ValueError:
        raise _incomplete("X-Amz-Date must be a signed YYYYMMDD'T'HHMMSS'Z' date") from None
    if amz_date[:8] != scope_date:
        raise _incomplete("the date of the credential scope is not the date of X-Amz-Date")
    now = time.strftime(_DATE_FORMAT, time.gmtime(now_ms // 1000))
    if when_ms < now_ms - MAX_SKEW_MS:
        raise _mismatch(f"Signature expired: {amz_date} is now earlier than {now} - 5 min.")
    if when_ms > now_ms + MAX_SKEW_MS:
        raise _mismatch(f"Signature not yet current: {amz_date} is still later than {now} + 5 min.")


def canonical_request(
    method: str,
    raw_path: str,
    headers: CIMultiDictProxy[str] | MultiMapping[str],
    signed_headers: list[str],
    payload_hash: str,
) -> str:
    """SigV4's canonical form of a request."""
    path, _, query = raw_path.partition("?")
    pairs = sorted(tuple(p.partition("=")[::2]) for p in query.split("&") if p)
    lines = [
        method.upper(),
        quote(path or "/", safe="/~"),
        "&".join(f"{k}={v}" for k, v in pairs),
    ]
    for name in sorted(set(signed_headers)):
        values = headers.getall(name, [])
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    lines.append("")
    lines.append(";".join(signed_headers))
    lines.append(payload_hash)
    return "\n".join(lines)


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key derived from the secret for one day, region and service."""
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key
