"""Server settings: command line, then environment (``EVQ_*``), then a TOML file, then defaults.

This and :mod:`gateway.server` are the only places that read the environment.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from actors.errors import BadRequest
from actors.handshake import MIN_SECRET_CHARS

__all__ = ["ServerSettings", "add_arguments", "is_loopback", "load_settings"]

MIB = 1024 * 1024
# A Ray actor process costs ~52 MiB (PSS) here (loadtest/RESULTS.md, "Ray actor cost"):
# shards may use at most this share of the machine's memory.
SHARD_MEMORY_SHARE = 0.05
SHARD_PROCESS_MIB = 52
# A request body's limit: a queue's largest message (64 MiB) as base64 in JSON is 85.4 MiB.
MAX_BODY_BYTES = 96 * MIB
# The shipped Kubernetes manifests' secrets start with this: they work, and are logged as an
# error until replaced.
PLACEHOLDER = "REPLACE_ME"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerSettings(msgspec.Struct, kw_only=True):
    """Everything ``evq serve`` can be told."""

    data: str = "./evq-data"
    store: str | None = None  # a URL (s3://bucket/prefix, …); overrides data
    endpoint: str | None = None  # object-store endpoint override (S3-compatible servers)
    region: str | None = None
    # An object store's request timeout and how long a call is retried (obstore); None: the
    # store's defaults (actors/log/obstore_store.py: 10 s and 15 s).
    s3_request_timeout_ms: Annotated[int, msgspec.Meta(gt=0)] | None = None
    s3_retry_timeout_ms: Annotated[int, msgspec.Meta(gt=0)] | None = None
    host: str = "127.0.0.1"
    port: int = 8700
    # HTTPS on the port (every route): the certificate chain and its key, PEM files; reloaded
    # when they change (gateway/tls.py). Off loopback, a server needs them, or
    # behind_tls_proxy: a proxy in front terminates TLS.
    tls_cert: str | None = None
    tls_key: str | None = None
    behind_tls_proxy: bool = False
    # Seal the data channel's frames even when a gateway and its shard are both on loopback
    # (the embedded server leaves them plain there; a cluster always seals).
    seal_channel: bool = False
    # Behind a proxy: the addresses (IPs or networks, comma-separated) whose X-Forwarded-For
    # and X-Forwarded-Proto are believed (default: loopback only).
    trusted_proxies: str = "127.0.0.1/8,::1"
    # A cost to the sender (gateway/penalty.py): this many requests that fail as HTTP (do
    # not parse, or come too slowly) from one address within 10 s, and its connections are
    # refused at accept for refuse_for_s, doubled at each ban that follows (up to 300 s).
    # 0: never. Trusted proxies (behind_tls_proxy) are never refused.
    refuse_after: Annotated[int, msgspec.Meta(ge=0)] = 20
    refuse_for_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    workers: int = 1  # gateway processes sharing the port (SO_REUSEPORT)
    # default: the store's count (actors.log.layout), else one per two CPUs (memory-bound)
    shards: Annotated[int, msgspec.Meta(ge=1)] | None = None
    auto_create: bool = False
    # The largest message a queue takes (64 MiB) is 85.4 MiB as base64 in JSON: it must fit.
    max_body_bytes: int = MAX_BODY_BYTES
    max_requests: int = 10_000
    max_connections: int = 15_000  # HTTP connections per gateway process (watchers apart)
    shard_memory_mb: int | None = None  # per shard: puts are refused past it (default: RAM/2/n)
    max_waiting_takes: int = 50_000
    batch_in_flight: int = (
        2  # calls toward a shard at once (a shard budgets actors.channel.CALLS_IN_FLIGHT)
    )
    batch_split_at: int = 128  # gathered commands that open another call
    max_watchers: int = 19_000  # WebSocket + long-poll watchers per gateway process
    ws_send_buffer_bytes: int = 256 * 1024  # a watcher that lets more pile up is closed
    snapshot_every_records: int = 200_000
    snapshot_every_s: float = 300.0
    # A queue of at least this many messages encodes its snapshots in a forked child, its
    # shard serving meanwhile (actors/log/forked.py); 0: every queue; -1: none.
    snapshot_fork_above: Annotated[int, msgspec.Meta(ge=-1)] = 250_000
    # Bodies of a local log's spilled messages read back and kept, per shard (MiB).
    body_cache_mb: Annotated[int, msgspec.Meta(ge=0)] = 16
    # An object store's shards copy their log's segments here and read bodies back from
    # the copy (default: a directory under the system's temporary one, by store; "none":
    # their messages' bodies stay in memory).
    segment_cache: str | None = None
    # Compaction: the oldest segments, kept only for queued bodies, are rewritten once they
    # are more than this many times those bodies (actors/settings.py LogSettings; 0: never).
    compact_over: Annotated[float, msgspec.Meta(ge=0)] = 1.5
    # Days the archive keeps what the log prunes (actors/log/archive.py); None: forever;
    # 0: no archive (pruned history is gone).
    archive_retention_days: Annotated[int, msgspec.Meta(ge=0)] | None = None
    ray_address: str | None = None  # join an existing Ray cluster instead of starting one
    ray_cpus: int | None = None
    shard_spread: bool = False  # spread the shards over the Ray cluster's nodes
    shard_resource: str | None = None  # custom Ray resource a node must offer to host shards
    no_ray: bool = False  # queues in the gateway process (debugging)
    shutdown_timeout_s: float = 30.0
    log_level: str = "INFO"
    log_format: str = "text"  # text, kv (key=value) or json
    log_mode: str = "drop"  # a slow log sink: drop (and count) records, or block
    # SQS API credentials, "ACCESS_KEY:SECRET[,ACCESS_KEY:SECRET…]" (environment or TOML:
    # keep secrets off the command line). Set: every SQS request needs a valid SigV4.
    sqs_keys: str | None = None
    # The account in SQS queue URLs and ARNs (12 digits, as AWS's).
    sqs_account_id: Annotated[str, msgspec.Meta(pattern=r"^\d{12}$")] = "000000000000"
    tokens_file: str | None = None  # bearer tokens and permissions (gateway/auth.py)
    # The secret every gateway, shard and handler of one Ray cluster shows the shards' data
    # channels: EVQ_CLUSTER_SECRET (or TOML), or a file; never on the command line. Unset,
    # the embedded default makes one; joining a cluster (ray_address) needs it.
    cluster_secret: str | None = None
    cluster_secret_file: str | None = None

    def cluster_secret_value(self) -> str | None:
        """The cluster secret as set (None: not set).

        Raises:
            BadRequest: the file does not read, or the secret is shorter than 16 characters.
        """
        if self.cluster_secret:
            value = self.cluster_secret.strip()
        elif self.cluster_secret_file:
            try:
                value = Path(self.cluster_secret_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise BadRequest(
                    f"cannot read cluster_secret_file {self.cluster_secret_file}: {exc}"
                ) from None
        else:
            return None
        if len(value) < MIN_SECRET_CHARS:
            raise BadRequest(
                f"the cluster secret must be at least {MIN_SECRET_CHARS} characters long"
            )
        return value

    def sqs_key_map(self) -> dict[str, str]:
        """The SQS access keys and their secrets.

        Raises:
            BadRequest: an entry is not ``KEY:SECRET``.
        """
        keys: dict[str, str] = {}
        for entry in (self.sqs_keys or "").split(","):
            if not entry.strip():
                continue
            key, sep, secret = entry.strip().partition(":")
            if not sep or not key or not secret:
                raise BadRequest("sqs_keys must be KEY:SECRET pairs separated by commas")
            keys[key] = secret
        return keys

    def tls_files(self) -> tuple[str, str] | None:
        """The certificate and key files, or None for plain HTTP.

        Raises:
            BadRequest: one is given without the other.
        """
        if bool(self.tls_cert) != bool(self.tls_key):
            raise BadRequest("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
        return (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None

    def proxy_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """The networks whose X-Forwarded-* headers are believed.

        Raises:
            BadRequest: an entry is not an address or a network.
        """
        networks = []
        for entry in self.trusted_proxies.split(","):
            if entry.strip():
                try:
                    networks.append(ipaddress.ip_network(entry.strip(), strict=False))
                except ValueError:
                    raise BadRequest(
                        f"trusted_proxies: {entry.strip()!r} is not an address or a network"
                    ) from None
        return networks

    def store_target(self) -> str:
        """The store to open: the URL, or the data directory as an absolute path."""
        return self.store or os.path.abspath(self.data)

    def store_options(self) -> dict[str, Any]:
        """Options for ``open_store`` (only those given)."""
        options: dict[str, Any] = {}
        if self.store and self.endpoint:
            options["endpoint"] = self.endpoint
        if self.store and self.region:
            options["region"] = self.region
        s3 = bool(self.store) and urlsplit(self.store or "").scheme.lower() in ("s3", "s3a")
        if s3 and self.s3_request_timeout_ms is not None:
            options["request_timeout_ms"] = self.s3_request_timeout_ms
        if s3 and self.s3_retry_timeout_ms is not None:
            options["retry_timeout_ms"] = self.s3_retry_timeout_ms
        return options

    def shard_memory_bytes(self) -> int:
        """Each shard's memory budget: as set, else half the machine's memory shared out."""
        if self.shard_memory_mb is not None:
            return self.shard_memory_mb * MIB
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = 4096 * MIB
        return int(total / 2 / self.shard_count())

    def shard_count(self) -> int:
        """Shards to run: as set, else one per two CPUs bounded by the memory share (the
        server settles it against the store's layout before it starts: gateway.server).

        One per two CPUs, not one per CPU: a busy shard keeps about half a core busy for
        every core the gateway uses on the hot path, and each shard adds a log and a commit
        stream of its own; on 2 cores one shard serves 64 producers spread over 64 queues
        at about 16.9k puts/s where two served 12.8-15.1k (loadtest/RESULTS.md)."""
        if self.shards is not None:
            return self.shards
        cpus = max(1, (os.cpu_count() or 1) // 2)
        try:
            total_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MIB
        except (ValueError, OSError):
            total_mib = 4096
        by_memory = int(total_mib * SHARD_MEMORY_SHARE / SHARD_PROCESS_MIB)
        return max(1, min(cpus, by_memory))


def _types_of(annotation: Any) -> set[Any]:
    """The types a field's annotation allows (``Annotated[int, …] | None`` → {int, NoneType})."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _types_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_types_of(a) for a in typing.get_args(annotation)))
    return {annotation}


_FIELDS = ServerSettings.__struct_fields__
# Settings that are not text: an empty EVQ_* variable leaves them unset (manifests often
# declare a variable and leave it empty) instead of failing to parse.
_NOT_TEXT = frozenset(
    f.name for f in msgspec.structs.fields(ServerSettings) if str not in _types_of(f.type)
)


class _RefuseSecret(argparse.Action):
    """``--cluster-secret`` is refused: a command line is visible to every user of the
    machine (ps, /proc)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        parser.error(
            "the cluster secret is not taken on the command line: "
            "set EVQ_CLUSTER_SECRET, or name a file with --cluster-secret-file"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evq serve`` options (defaults come from the environment and TOML, not here)."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="TOML file with settings (keys as below, with _)")
    add("--data", metavar="DIR", help="local data directory (default ./evq-data)")
    add(
        "--store", metavar="URL", help="object store URL instead of --data, e.g. s3://bucket/prefix"
    )
    add("--endpoint", metavar="URL", help="object-store endpoint override")
    add("--region")
    add(
        "--s3-request-timeout-ms",
        type=int,
        metavar="MS",
        help="an object-store request's timeout (default 10000)",
    )
    add(
        "--s3-retry-timeout-ms",
        type=int,
        metavar="MS",
        help="how long an object-store call is retried (default 15000)",
    )
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port to listen on (default 8700)")
    add("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    add("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    add(
        "--behind-tls-proxy",
        action="store_true",
        default=None,
        help="plain HTTP off loopback: a proxy in front terminates TLS",
    )
    add(
        "--seal-channel",
        action="store_true",
        default=None,
        help="encrypt the gateway-shard channel on loopback too (a cluster's always is)",
    )
    add(
        "--trusted-proxies",
        metavar="NETS",
        help="addresses whose X-Forwarded-For/-Proto are believed (default 127.0.0.1/8,::1)",
    )
    add(
        "--refuse-after",
        type=int,
        metavar="N",
        help="refuse an address at accept after N requests within 10 s that fail as HTTP "
        "(default 20; 0: never)",
    )
    add(
        "--refuse-for-s",
        type=float,
        metavar="S",
        help="how long such an address is refused, doubled at each ban that follows (default 10)",
    )
    add(
        "--workers",
        type=int,
        help="gateway processes sharing the port (default 1; each holds up to 19k watchers)",
    )
    add("--max-watchers", type=int, help="watchers per gateway process (default 19000)")
    add(
        "--ws-send-buffer-bytes",
        type=int,
        help="a WebSocket watcher with more unsent data than this is closed (code 4008)",
    )
    add(
        "--shards",
        type=int,
        help="queue shard processes (default: the store's count, else one per two CPUs)",
    )
    add("--auto-create", action="store_true", default=None, help="create queues on first put")
    add("--max-body-bytes", type=int)
    add("--max-requests", type=int)
    add("--max-connections", type=int, help="HTTP connections per gateway process")
    add(
        "--shard-memory-mb",
        type=int,
        help="memory budget of each shard process: puts are refused (429) beyond it",
    )
    add("--snapshot-every-records", type=int)
    add("--snapshot-every-s", type=float)
    add(
        "--snapshot-fork-above",
        type=int,
        metavar="N",
        help="queues of N messages and more encode their snapshots in a forked child, so "
        "their shard serves meanwhile (default 250000; 0: all; -1: none)",
    )
    add(
        "--body-cache-mb",
        type=int,
        help="per shard: bodies read back from a local log and kept for the next takes",
    )
    add(
        "--segment-cache",
        metavar="DIR",
        help="object stores: where shards keep a local copy of the log to read bodies from "
        "(default: under the temporary directory; none: bodies stay in memory)",
    )
    add(
        "--compact-over",
        type=float,
        metavar="TIMES",
        help="compact the oldest log segments once they are more than this many times the "
        "bodies of queued messages that keep them (default 1.5; 0: never)",
    )
    add(
        "--archive-retention-days",
        type=int,
        help="days the archive keeps the pruned log (default: forever; 0: no archive)",
    )
    add("--ray-address", help="join this Ray cluster instead of starting a local one")
    add("--ray-cpus", type=int)
    add(
        "--shard-spread",
        action="store_true",
        default=None,
        help="spread the shards over the Ray cluster's nodes (SPREAD scheduling)",
    )
    add(
        "--shard-resource",
        metavar="NAME",
        help="custom Ray resource each shard needs one unit of (nodes offering it host shards)",
    )
    add("--no-ray", action="store_true", default=None, help="run the queues in this process")
    add(
        "--sqs-account-id",
        metavar="ID",
        help="the account (12 digits) in SQS queue URLs and ARNs (default 000000000000)",
    )
    add(
        "--tokens-file",
        metavar="FILE",
        help="bearer tokens with per-queue permissions (TOML or JSON); also EVQ_TOKENS (JSON)",
    )
    add(
        "--cluster-secret",
        action=_RefuseSecret,
        help=argparse.SUPPRESS,  # named only to refuse it, not to abbreviate the file option
    )
    add(
        "--cluster-secret-file",
        metavar="FILE",
        help="file holding the secret the gateways and shards of one Ray cluster share "
        "(also EVQ_CLUSTER_SECRET; needed with --ray-address)",
    )
    add("--shutdown-timeout-s", type=float)
    add("--log-level")
    add("--log-format", choices=["text", "kv", "json"])
    add(
        "--log-mode",
        choices=["drop", "block"],
        help="when the log sink is slow: drop records and count them (default), or wait",
    )


def load_settings(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> ServerSettings:
    """Merge the command line, ``EVQ_*`` variables, the TOML file and the defaults.

    Raises:
        BadRequest: an unknown key or a value of the wrong type.
    """
    environ = dict(os.environ if environ is None else environ)
    merged: dict[str, Any] = {}
    config = getattr(args, "config", None) or environ.get("EVQ_CONFIG")
    if config:
        data = tomllib.loads(Path(config).read_text())
        section = data.get("evq", data)
        unknown = set(section) - set(_FIELDS)
        if unknown:
            raise BadRequest(f"unknown settings in {config}: {', '.join(sorted(unknown))}")
        merged.update(section)
    for field in _FIELDS:
        value = environ.get(f"EVQ_{field.upper()}")
        if value is not None and not (value == "" and field in _NOT_TEXT):
            merged[field] = value
    for field in _FIELDS:
        value = getattr(args, field, None)
        if value is not None:
            merged[field] = value
    try:
        return msgspec.convert(merged, ServerSettings, strict=False)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid setting: {exc}") from None
