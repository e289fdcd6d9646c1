"""``evq serve``: a local Ray runtime, the queue shards and the aiohttp gateway.

Start: settings → Ray (local, or ``--ray-address``) → shard actors (they recover their
queues; ``/readyz`` says 503 until they have) → the gateway on ``--host:--port``.
Stop (SIGTERM / SIGINT): stop accepting connections, let waiting takes answer, finish the
requests in flight, close every queue (finish writes, snapshot), stop Ray, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from actors import handshake
from actors.directory import Directory, LocalDirectory, RayDirectory
from actors.errors import QueueError
from actors.logsetup import LogConfig, forward_ray_output
from actors.settings import LogSettings
from actors.shard import tune_collector
from gateway import door
from gateway.app import app_options, make_app
from gateway.auth import Token, read_tokens
from gateway.logs import setup_logging
from gateway.presence import ABOUT
from gateway.settings import (
    PLACEHOLDER,
    ServerSettings,
    add_arguments,
    is_loopback,
    load_settings,
)
from gateway.tls import Certificates, subject
from gateway.workers import supervise

if TYPE_CHECKING:
    from actors.spawn import ShardSpawner, ShardSpec

__all__ = ["add_arguments", "main", "reshard_main", "run", "settle_shards"]

log = logging.getLogger("evq.serve")


def main(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT; return the exit code."""
    try:
        settings = load_settings(args)
        settings.sqs_key_map()  # a malformed key list stops the start here
        settings.proxy_networks()
        tls = settings.tls_files()
        if tls is not None:
            Certificates(*tls)  # files that do not load stop the start here
        tokens = read_tokens(settings.tokens_file, os.environ.get("EVQ_TOKENS"))
    except (QueueError, OSError, ValueError) as exc:
        print(f"evq serve: {exc}", file=sys.stderr)
        return 2
    if not tokens and not is_loopback(settings.host):
        print(
            f"evq serve: no tokens configured: the API would be open to anyone on "
            f"{settings.host}; configure tokens (--tokens-file or EVQ_TOKENS) or listen on "
            f"127.0.0.1",
            file=sys.stderr,
        )
        return 2
    if tls is None and not settings.behind_tls_proxy and not is_loopback(settings.host):
        print(
            f"evq serve: listening on {settings.host} without TLS would send tokens and messages "
            f"in clear text: give a certificate and its key (--tls-cert FILE --tls-key FILE, "
            f"or EVQ_TLS_CERT and EVQ_TLS_KEY), or, if a proxy in front terminates TLS, "
            f"--behind-tls-proxy (EVQ_BEHIND_TLS_PROXY=true)",
            file=sys.stderr,
        )
        return 2
    try:
        setup_logging(settings.log_level, settings.log_format, mode=settings.log_mode)
    except ValueError as exc:
        print(f"evq serve: {exc}", file=sys.stderr)
        return 2
    if tokens:
        signers = sum(t.sqs_access_key is not None for t in tokens)
        log.info("auth on: %d caller(s), %d with SQS keys", len(tokens), signers)
        if not signers and not settings.sqs_key_map() and not is_loopback(settings.host):
            log.warning(
                "the SQS API has no access keys (sqs_access_key in the tokens, or "
                "EVQ_SQS_KEYS): it refuses every request while listening on %s",
                settings.host,
            )
        for token in tokens:
            if (token.token or "").startswith(PLACEHOLDER):
                log.error(
                    "token %r is the shipped placeholder (%s…): anyone who read the "
                    "manifests can use it; replace it",
                    token.name,
                    PLACEHOLDER,
                )
    else:
        log.warning("no tokens configured: the API is open, listening on %s only", settings.host)
    if tls is not None and subject(tls[0]).startswith(PLACEHOLDER):
        log.error(
            "the TLS certificate is the shipped placeholder (%s…): its key is public, so the "
            "connections are not private; replace the pair (EVQ_TLS_CERT, EVQ_TLS_KEY)",
            PLACEHOLDER,
        )
    return run(settings, tokens)


def settle_shards(settings: ServerSettings) -> ServerSettings:
    """``settings`` with the shard count to run: the one asked for, else the one the store's
    shard logs were written with, else the default for this machine (see
    :mod:`actors.log.layout`).

    Raises:
        LayoutMismatch: the count asked for is not the store's.
        QueueError: the store failed or its layout does not decode.
    """
    from actors.log.layout import settle_layout
    from actors.log.stores import open_store

    async def settle() -> int:
        store = open_store(settings.store_target(), **settings.store_options())
        try:
            return await settle_layout(store, settings.shards, settings.shard_count())
        finally:
            await store.close()

    return msgspec.structs.replace(settings, shards=asyncio.run(settle()))


def reshard_main(args: argparse.Namespace) -> int:
    """``evq reshard --shards N``: change the shard count of a stopped server's store (same
    settings sources as ``evq serve``); return the exit code."""
    from actors.log.stores import open_store
    from actors.reshard import describe, reshard

    try:
        settings = load_settings(args)
    except (QueueError, OSError, ValueError) as exc:
        print(f"evq reshard: {exc}", file=sys.stderr)
        return 2
    if settings.shards is None:
        print("evq reshard: say how many shards: --shards N", file=sys.stderr)
        return 2
    count = settings.shards

    async def go() -> str:
        store = open_store(settings.store_target(), **settings.store_options())
        try:
            say = lambda text: print(f"evq reshard: {text}", file=sys.stderr)  # noqa: E731
            return describe(await reshard(store, count, say=say))
        finally:
            await store.close()

    try:
        print(asyncio.run(go()))
    except QueueError as exc:
        print(f"evq reshard: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    return 0


def log_settings_of(settings: ServerSettings) -> LogSettings:
    """How the shards use the log, from the server settings."""
    return LogSettings(
        snapshot_every_records=settings.snapshot_every_records,
        snapshot_every_ms=int(settings.snapshot_every_s * 1000),
        snapshot_fork_above=settings.snapshot_fork_above,
        body_cache_bytes=settings.body_cache_mb * 1024 * 1024,
        segment_cache=segment_cache_of(settings),
        compact_over=settings.compact_over,
        archive=settings.archive_retention_days != 0,
        archive_retention_days=settings.archive_retention_days or None,
    )


def segment_cache_of(settings: ServerSettings) -> str | None:
    """Where an object store's shards copy their log (None: a local log, or "none")."""
    if settings.store is None or settings.segment_cache == "none":
        return None
    if settings.segment_cache is not None:
        return settings.segment_cache
    store = hashlib.sha256(settings.store.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "evq-segments", store)


def run(settings: ServerSettings, tokens: Sequence[Token] = ()) -> int:
    """Serve with ``settings`` and the bearer ``tokens`` read at start (the environment is
    read in :func:`main` only; worker processes get them from this one); return the exit
    code."""
    try:
        settings = settle_shards(settings)
    except QueueError as exc:
        print(f"evq serve: {exc}", file=sys.stderr)
        return 2
    log_settings = log_settings_of(settings)
    try:
        secret = settings.cluster_secret_value()
    except QueueError as exc:
        print(f"evq serve: {exc}", file=sys.stderr)
        return 2
    if secret is None:
        if settings.ray_address:
            print(
                "evq serve: joining a Ray cluster (--ray-address) needs the cluster's secret: "
                "set EVQ_CLUSTER_SECRET or cluster_secret_file, the same for every gateway",
                file=sys.stderr,
            )
            return 2
        secret = secrets.token_hex(16)  # the embedded default: this server's own cluster
    elif secret.startswith(PLACEHOLDER):
        log.error(
            "the cluster secret is the shipped placeholder (%s…): replace it in every gateway "
            "(EVQ_CLUSTER_SECRET), then stop and restart the shards",
            PLACEHOLDER,
        )
    workers = max(1, settings.workers)
    if settings.no_ray:
        if workers > 1:
            print("evq serve: --workers needs Ray (not --no-ray)", file=sys.stderr)
            return 2
        directory: Directory = _local_directory(settings, log_settings)
    else:
        try:
            directory = _ray_directory(settings, log_settings, secret)
        except ShardsRefused as exc:
            log.error("evq serve: %s", exc)
            print(f"evq serve: {exc}", file=sys.stderr)
            import ray

            ray.shutdown()
            return 2
    app = make_app(directory, app_options(settings, secret, tokens))
    app[door.HUP] = []
    scheme = "https" if settings.tls_files() else "http"
    app[ABOUT] = {"listen": f"{scheme}://{settings.host}:{settings.port}", "processes": workers}
    if workers > 1:
        assert isinstance(directory, RayDirectory)
        app.cleanup_ctx.append(
            supervise(
                workers,
                settings,
                directory.secret,
                directory.count,
                directory.address,
                list(tokens),
            )
        )
    log.info(
        "evq serving on %s://%s:%d (store %s, %d shard(s), %d gateway process(es)%s)",
        "https" if settings.tls_files() else "http",
        settings.host,
        settings.port,
        settings.store_target(),
        directory.count,
        workers,
        ", queues auto-created" if settings.auto_create else "",
    )
    tune_collector()  # after the imports: they stay out of the collector's walks
    try:
        door.run(
            app,
            host=settings.host,
            port=settings.port,
            reuse_port=workers > 1,
            shutdown_timeout=settings.shutdown_timeout_s,
            backlog=4096,  # bursts of connecting watchers
            tls=settings.tls_files(),
        )
    finally:
        if not settings.no_ray:
            import ray

            ray.shutdown()
    log.info("evq stopped")
    return 0


def _local_directory(settings: ServerSettings, log_settings: LogSettings) -> LocalDirectory:
    from actors.log.stores import open_store

    store = open_store(settings.store_target(), **settings.store_options())
    return LocalDirectory(
        store,
        count=settings.shard_count(),
        log_settings=log_settings,
        memory_budget_bytes=settings.shard_memory_bytes(),
    )


CHECK_WAIT_S = 20.0  # how long a starting gateway waits to check the shards it found


class ShardsRefused(Exception):
    """The shards this gateway found in the Ray cluster are not for it (another cluster
    secret, shard count or store)."""


def _ray_directory(
    settings: ServerSettings, log_settings: LogSettings, secret: str
) -> RayDirectory:
    """The shards on Ray: this server's own (a local Ray it starts: they stop with it), or,
    joining a cluster (``ray_address``), the cluster's: attached to if they run, created
    detached if not, and left running when this gateway stops.

    Raises:
        ShardsRefused: the cluster's shards hold another secret, count or store.
    """
    import ray

    from actors.localray import init_local
    from actors.spawn import NAMESPACE, ShardSpawner, ShardSpec

    local = not settings.ray_address
    if local and os.environ.get("EVQ_UVLOOP") == "0":
        os.environ["RAY_USE_UVLOOP"] = "0"  # the shards on asyncio's loop too (gateway.door)
    start = init_local if local else ray.init
    start(
        address=settings.ray_address,
        num_cpus=(settings.ray_cpus or os.cpu_count()) if local else None,
        # A local runtime offers the shards' resource itself; a cluster's nodes declare it.
        resources=(
            {settings.shard_resource: settings.shard_count()}
            if local and settings.shard_resource
            else None
        ),
        include_dashboard=False,
        namespace=NAMESPACE,
        logging_level=logging.WARNING,
        log_to_driver=True,
        # Shards serve requests: Ray's default niceness of 15 for workers would put them
        # behind everything else on a busy machine.
        _system_config={"worker_niceness": 0} if not settings.ray_address else None,
    )
    forward_ray_output()  # the shards' lines in this process's log format and mode
    spec = ShardSpec(
        count=settings.shard_count(),
        store=settings.store_target(),
        # In a cluster each shard reads the secret from its node (actors/spawn.py): Ray's
        # traffic between nodes is not ours to encrypt. The embedded server's Ray is local.
        secret=secret if local else None,
        store_options=settings.store_options(),
        log_settings=log_settings,
        memory_budget_bytes=settings.shard_memory_bytes(),
        log=LogConfig(settings.log_level, settings.log_format, settings.log_mode),
        # the embedded server's loopback channels; a cluster's are always sealed
        plain_on_loopback=local and not settings.seal_channel,
    )
    spawner = ShardSpawner(
        spec, spread=settings.shard_spread, resource=settings.shard_resource, detached=not local
    )
    span = _span(spawner, spec.count)
    handles = spawner.spawn(span)
    if not local:  # a local Ray is new: its shards are this server's own
        _check_shards(handles, spec, secret)
    return RayDirectory(handles, secret, owns_shards=local, spawner=spawner, count=spec.count)


def _span(spawner: ShardSpawner, count: int) -> int:
    """The shards to run for a store of ``count`` shards: more while a shrink that stopped
    midway still pins queues past the count (its placement map's span)."""
    from actors.log.placement import read_placement

    async def read() -> int:
        store = spawner.open_store()
        try:
            return (await read_placement(store, count)).span
        finally:
            await store.close()

    return max(count, asyncio.run(read()))


def _check_shards(handles: list[Any], spec: ShardSpec, secret: str) -> None:
    """Whether the cluster's shards are for this gateway (its ``secret``, count and store).

    Raises:
        ShardsRefused: a shard says why not.
    """
    import ray

    fingerprint = handshake.fingerprint(secret)  # the secret stays in this process
    checks = [h.check.remote(spec.count, spec.store, fingerprint) for h in handles]
    done, waiting = ray.wait(checks, num_returns=len(checks), timeout=CHECK_WAIT_S)
    refused = [r for r in ray.get(done) if r is not None]
    if refused:
        raise ShardsRefused(refused[0])
    if waiting:  # not placed yet (no node for them): their channels will refuse a bad secret
        log.warning("%d shard(s) not running yet: not checked against this gateway", len(waiting))


def shards_main(args: argparse.Namespace) -> int:
    """``evq shards status|stop``: the shards of a Ray cluster, which outlive its gateways;
    ``stop`` closes each (writes finished, queues snapshotted) and ends it. Returns the exit
    code."""
    import ray

    from actors.spawn import NAMESPACE, running_shards

    address = args.ray_address or os.environ.get("EVQ_RAY_ADDRESS") or "auto"
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            logging_level=logging.WARNING,
            log_to_driver=False,
            include_dashboard=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"evq shards: cannot join the Ray cluster at {address}: {exc}", file=sys.stderr)
        return 2
    try:
        shards = running_shards()
        if args.action == "status":
            for index, handle in shards.items():
                try:
                    status, pid = ray.get(
                        [handle.status.remote(), handle.pid.remote()], timeout=args.timeout
                    )
                    doc = {
                        "shard": index,
                        "pid": pid,
                        "ready": status.ready,
                        "queues": status.queues,
                    }
                except (ray.exceptions.RayError, TimeoutError) as exc:
                    doc = {"shard": index, "error": type(exc).__name__}
                print(json.dumps(doc), flush=True)
            if not shards:
                print("evq shards: no shards run in this Ray cluster", file=sys.stderr)
            return 0
        for index, handle in shards.items():
            try:
                ray.get(handle.close.remote(), timeout=args.timeout)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                print(
                    f"evq shards: shard {index} did not close ({exc!r}); ending it", file=sys.stderr
                )
            ray.kill(handle, no_restart=True)
            print(json.dumps({"shard": index, "stopped": True}), flush=True)
        return 0
    finally:
        ray.shutdown()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evq serve", description=__doc__)
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    raise SystemExit(main(_parser().parse_args()))
