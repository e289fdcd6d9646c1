"""``evq serve`` settings: the shard count's default and the checks on it."""

from __future__ import annotations

import argparse
import os

import pytest

from actors.errors import BadRequest
from actors.settings import MAX_MESSAGE_BYTES_LIMIT
from gateway.app import AppOptions, app_options
from gateway.server import log_settings_of
from gateway.settings import SHARD_MEMORY_SHARE, SHARD_PROCESS_MIB, ServerSettings, load_settings


def test_the_default_shard_count_is_one_per_two_cpus_bounded_by_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 64 * 1024**3 // 4096}  # 64 GiB
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    for cpus, expected in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        assert ServerSettings().shard_count() == expected
    pages["SC_PHYS_PAGES"] = 2 * 1024**3 // 4096  # 2 GiB: memory bounds it
    by_memory = int(2 * 1024 * SHARD_MEMORY_SHARE / SHARD_PROCESS_MIB)
    assert ServerSettings().shard_count() == max(1, min(8, by_memory))
    assert ServerSettings(shards=5).shard_count() == 5


def test_the_default_body_limit_takes_the_largest_message_as_base64_in_json() -> None:
    base64_chars = (MAX_MESSAGE_BYTES_LIMIT + 2) // 3 * 4
    envelope = len('{"messages":[{"body_b64":"","idempotency_key":"k-0123456789abcdefghijkl"}]}')
    assert base64_chars + envelope <= ServerSettings().max_body_bytes
    assert AppOptions().max_body_bytes == ServerSettings().max_body_bytes  # an app made in code


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_shard_count_below_one_is_refused(value: str) -> None:
    with pytest.raises(BadRequest, match="shards"):
        load_settings(argparse.Namespace(), {"EVQ_SHARDS": value})
    assert load_settings(argparse.Namespace(), {"EVQ_SHARDS": "3"}).shards == 3


def _settings(environ: dict[str, str], *argv: str) -> ServerSettings:
    from gateway.settings import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(list(argv)), environ)


def test_the_cluster_secret_comes_from_the_environment_or_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert _settings({}).cluster_secret_value() is None
    secret = "s" * 16
    assert _settings({"EVQ_CLUSTER_SECRET": f" {secret}\n"}).cluster_secret_value() == secret
    path = tmp_path / "secret"
    path.write_text(f"{secret}-from-a-file\n")
    from_file = _settings({}, "--cluster-secret-file", str(path))
    assert from_file.cluster_secret_value() == f"{secret}-from-a-file"
    env_file = _settings({"EVQ_CLUSTER_SECRET_FILE": str(path)})
    assert env_file.cluster_secret_value() == f"{secret}-from-a-file"
    # The variable wins over the file.
    both = _settings({"EVQ_CLUSTER_SECRET": secret}, "--cluster-secret-file", str(path))
    assert both.cluster_secret_value() == secret


def test_the_cluster_secret_is_not_taken_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    from gateway.settings import add_arguments

    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cluster-secret", "s" * 16])
    err = capsys.readouterr().err
    assert "not taken on the command line" in err
    assert "s" * 16 not in err


@pytest.mark.parametrize("value", ["", "short", "x" * 15])
def test_a_short_cluster_secret_is_refused(value: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "secret"
    path.write_text(value)
    settings = _settings({}, "--cluster-secret-file", str(path))
    with pytest.raises(BadRequest, match="at least 16 characters"):
        settings.cluster_secret_value()


def test_an_unreadable_cluster_secret_file_says_which(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nowhere"
    with pytest.raises(BadRequest, match=r"cannot read cluster_secret_file .*nowhere"):
        _settings({}, "--cluster-secret-file", str(missing)).cluster_secret_value()


def test_the_sqs_account_id_comes_from_flag_environment_or_toml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert _settings({}).sqs_account_id == "000000000000"
    assert _settings({}, "--sqs-account-id", "123456789012").sqs_account_id == "123456789012"
    assert _settings({"EVQ_SQS_ACCOUNT_ID": "210987654321"}).sqs_account_id == "210987654321"
    config = tmp_path / "evq.toml"
    config.write_text('[evq]\nsqs_account_id = "111122223333"\n')
    assert _settings({}, "--config", str(config)).sqs_account_id == "111122223333"
    # The command line wins over the environment, which wins over the file.
    env = {"EVQ_SQS_ACCOUNT_ID": "210987654321", "EVQ_CONFIG": str(config)}
    assert _settings(env).sqs_account_id == "210987654321"
    assert _settings(env, "--sqs-account-id", "123456789012").sqs_account_id == "123456789012"
    options = app_options(_settings({}, "--sqs-account-id", "123456789012"))
    assert options.sqs_account_id == "123456789012"


@pytest.mark.parametrize("value", ["", "12345678901", "1234567890123", "12345678901x", " 123"])
def test_an_sqs_account_id_of_other_than_12_digits_is_refused(value: str) -> None:
    with pytest.raises(BadRequest, match="sqs_account_id"):
        _settings({"EVQ_SQS_ACCOUNT_ID": value})


@pytest.mark.parametrize(
    ("value", "archive", "days"),
    [(None, True, None), ("0", False, None), ("30", True, 30)],
)
def test_the_archive_retention_reaches_the_shards_log_settings(
    value: str | None, archive: bool, days: int | None
) -> None:
    env = {} if value is None else {"EVQ_ARCHIVE_RETENTION_DAYS": value}
    log = log_settings_of(load_settings(argparse.Namespace(), env))
    assert (log.archive, log.archive_retention_days) == (archive, days)
    with pytest.raises(BadRequest):
        load_settings(argparse.Namespace(), {"EVQ_ARCHIVE_RETENTION_DAYS": "-1"})


def test_the_object_stores_timeouts_are_server_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from actors.log.obstore_store import s3_limits

    store = ("--store", "s3://bucket/prefix")
    assert "request_timeout_ms" not in _settings({}, *store).store_options()  # the store's
    flags = ("--s3-request-timeout-ms", "2500", "--s3-retry-timeout-ms", "4000")
    options = _settings({}, *store, *flags).store_options()
    assert options == {"request_timeout_ms": 2500, "retry_timeout_ms": 4000}
    client, retry = s3_limits({}, dict(options))
    assert client["timeout"] == timedelta(milliseconds=2500)
    assert retry["retry_timeout"] == timedelta(milliseconds=4000)
    env = {"EVQ_S3_REQUEST_TIMEOUT_MS": "700", "EVQ_STORE": "s3://b/p"}
    assert _settings(env).store_options() == {"request_timeout_ms": 700}
    config = tmp_path / "evq.toml"
    config.write_text('[evq]\nstore = "s3://b/p"\ns3_retry_timeout_ms = 9000\n')
    assert _settings({}, "--config", str(config)).store_options() == {"retry_timeout_ms": 9000}
    assert _settings({}, *flags).store_options() == {}  # a local directory has no such thing
    for other in ("memory://", "gs://bucket/prefix", "file:///tmp/evq"):  # S3's options only
        assert (
            _settings({"EVQ_S3_REQUEST_TIMEOUT_MS": "700", "EVQ_STORE": other}).store_options()
            == {}
        )
    # An empty variable is no setting (as the store read it before), for every non-text one.
    empty = {"EVQ_S3_REQUEST_TIMEOUT_MS": "", "EVQ_PORT": "", "EVQ_STORE": "s3://b/p"}
    assert _settings(empty).store_options() == {}
    assert _settings(empty).port == 8700
    assert _settings({"EVQ_LOG_LEVEL": "debug", "EVQ_DATA": ""}).data == ""  # text stays text
    with pytest.raises(BadRequest, match="s3_request_timeout_ms"):
        _settings({}, *store, "--s3-request-timeout-ms", "0")


def test_an_object_store_gets_a_segment_cache_by_default_and_none_turns_it_off() -> None:
    import tempfile

    from gateway.server import segment_cache_of

    assert segment_cache_of(_settings({})) is None  # a local log reads its own files
    default = segment_cache_of(_settings({}, "--store", "s3://bucket/a"))
    assert default is not None
    assert default.startswith(tempfile.gettempdir())
    assert default != segment_cache_of(_settings({}, "--store", "s3://bucket/b"))  # by store
    chosen = _settings({}, "--store", "s3://bucket/a", "--segment-cache", "/var/cache/evq")
    assert segment_cache_of(chosen) == "/var/cache/evq"
    assert segment_cache_of(_settings({"EVQ_SEGMENT_CACHE": "/x"}, "--store", "s3://b/a")) == "/x"
    off = _settings({}, "--store", "s3://bucket/a", "--segment-cache", "none")
    assert segment_cache_of(off) is None


def test_compaction_s_ratio_is_a_setting() -> None:
    from gateway.server import log_settings_of

    assert log_settings_of(_settings({})).compact_over == 1.5
    assert log_settings_of(_settings({}, "--compact-over", "0")).compact_over == 0
    assert log_settings_of(_settings({"EVQ_COMPACT_OVER": "3"})).compact_over == 3
    with pytest.raises(BadRequest, match="compact_over"):
        _settings({}, "--compact-over", "-1")


def test_refusing_senders_of_bad_http_is_a_setting_that_reaches_the_app(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from actors.directory import LocalDirectory
    from actors.log.store import LocalDirStore
    from gateway.app import make_app
    from gateway.limits import PENALTIES

    default = app_options(_settings({}))
    assert (default.refuse_after, default.refuse_for_s) == (20, 10.0)
    options = app_options(_settings({"EVQ_REFUSE_AFTER": "5"}, "--refuse-for-s", "2.5"))
    assert (options.refuse_after, options.refuse_for_s) == (5, 2.5)
    proxied = app_options(
        _settings(
            {}, "--behind-tls-proxy", "--trusted-proxies", "10.0.0.0/8", "--refuse-after", "0"
        )
    )
    app = make_app(LocalDirectory(LocalDirStore(tmp_path), count=1), proxied)
    penalties = app[PENALTIES].penalties
    assert penalties.limit == 0
    assert [str(n) for n in penalties.exempt] == ["10.0.0.0/8"]
    with pytest.raises(BadRequest, match="refuse_after"):
        _settings({"EVQ_REFUSE_AFTER": "-1"})
