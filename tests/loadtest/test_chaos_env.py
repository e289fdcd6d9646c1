"""The chaos campaign's disk and object-store set-ups (loadtest/chaos_env.py), their pure
parts: which kinds a set-up offers, the order of the kinds, what counts as answering again
or as a failed shard in a ``/readyz`` answer, and the proxy rule of each object-store fault
(each one a rule loadtest/s3_fault_proxy.py accepts)."""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from chaos_env import (
    S3_KINDS,
    SEGMENT,
    answering,
    failed_shards,
    kind_sequence,
    known_kinds,
    parse_disks,
    s3_fault,
)

from loadtest.s3_fault_proxy import Rule

BASE = ("shard_kill", "pause")


@pytest.mark.parametrize(
    ("text", "disks"),
    [
        (None, ()),
        ("", ()),
        ("tmpfs", ("tmpfs",)),
        ("faultfs,tmpfs", ("faultfs", "tmpfs")),
        ("tmpfs,faultfs,tmpfs", ("faultfs", "tmpfs")),
    ],
)
def test_disks_are_parsed_in_one_order_without_repeats(
    text: str | None, disks: tuple[str, ...]
) -> None:
    assert parse_disks(text) == disks


def test_an_unknown_disk_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'ext4'"):
        parse_disks("tmpfs,ext4")


@pytest.mark.parametrize(
    ("disks", "s3", "extra"),
    [
        ((), False, ()),
        (("tmpfs",), False, ("disk_full",)),
        (("faultfs",), False, ("fsync_eio", "disk_slow")),
        (("faultfs", "tmpfs"), False, ("fsync_eio", "disk_slow", "disk_full")),
        ((), True, S3_KINDS),
    ],
)
def test_a_set_up_offers_the_process_faults_and_its_own(
    disks: tuple[str, ...], s3: bool, extra: tuple[str, ...]
) -> None:
    assert known_kinds(BASE, disks, s3) == BASE + extra


def test_kinds_in_turn_come_each_once_per_round_in_a_seeded_order() -> None:
    kinds = ["a", "b", "c", "d", "e"]
    first = list(islice(kind_sequence(kinds, random.Random(3), in_turn=True), 15))
    for r in range(3):
        assert sorted(first[5 * r : 5 * r + 5]) == kinds
    assert first == list(islice(kind_sequence(kinds, random.Random(3), in_turn=True), 15))
    assert first[:5] != first[5:10] or first[5:10] != first[10:15]  # shuffled each round


def test_kinds_at_random_are_drawn_from_the_kinds_given() -> None:
    drawn = Counter(islice(kind_sequence(["a", "b"], random.Random(1), in_turn=False), 200))
    assert set(drawn) == {"a", "b"}
    assert min(drawn.values()) > 50


@pytest.mark.parametrize(
    ("status", "doc", "ok"),
    [
        (200, {"status": "ready"}, True),
        (200, {"status": "ready", "degraded": [{"index": 1, "disk_full": "full"}]}, False),
        (503, {"status": "failed", "shards": [{"index": 0, "log_failed": "EIO"}]}, False),
        (503, {"status": "recovering", "shards": []}, False),
        (None, None, False),
        (200, None, False),
    ],
)
def test_answering_means_200_with_no_shard_degraded(status: int | None, doc: Any, ok: bool) -> None:
    assert answering(status, doc) is ok


@pytest.mark.parametrize(
    ("status", "doc", "failed"),
    [
        (503, {"status": "failed", "shards": [{"index": 1, "log_failed": "EIO"}]}, {1}),
        (503, {"status": "failed", "shards": [{"index": 0}, {"index": 2}]}, {0, 2}),
        (503, {"status": "recovering", "shards": [{"index": 1, "ready": False}]}, set()),
        (200, {"status": "ready", "degraded": [{"index": 1}]}, set()),
        (None, None, set()),
    ],
)
def test_failed_shards_are_those_of_a_503_failed(
    status: int | None, doc: Any, failed: set[int]
) -> None:
    assert failed_shards(status, doc) == failed


@pytest.mark.parametrize("kind", S3_KINDS)
def test_every_object_store_fault_is_a_rule_the_proxy_takes_within_its_window(kind: str) -> None:
    for seed in range(50):
        rule, window = s3_fault(kind, random.Random(seed))
        parsed = Rule(**rule)  # the proxy's control endpoint builds it the same way
        assert 0.5 <= window <= 3.0
        assert parsed.times is None or 1 <= parsed.times <= 4
        if kind in ("s3_reset", "s3_lost_answer"):
            assert parsed.method == "PUT"
            assert re.search(parsed.key, "/evq-chaos/chaos-1/wal/0001/00000000000000000042.seg")
            assert not re.search(parsed.key, "/evq-chaos/chaos-1/manifest/00000000000000000001")
        if kind == "s3_lost_answer":
            assert parsed.conditional is True
        if kind == "s3_timeout":
            assert parsed.hold_s > 1.5  # past the client's request timeout (chaos_env.S3_ENV)


def test_object_store_faults_are_the_proxy_faults_they_are_named_for() -> None:
    faults = {k: {s3_fault(k, random.Random(n))[0]["fault"] for n in range(20)} for k in S3_KINDS}
    assert faults == {
        "s3_500": {"internal_error"},
        "s3_503": {"slow_down"},
        "s3_timeout": {"hang"},
        "s3_reset": {"reset_upload"},
        "s3_lost_answer": {"lost_answer"},
    }
    assert SEGMENT.endswith(r"\.seg$")


def test_outages_are_sometimes_bounded_by_requests_and_sometimes_by_time() -> None:
    times = {s3_fault("s3_503", random.Random(n))[0]["times"] for n in range(40)}
    assert None in times
    assert times - {None}


def test_an_unknown_object_store_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="disk_full"):
        s3_fault("disk_full", random.Random(0))


def test_object_store_faults_repeat_with_their_seed() -> None:
    assert [s3_fault(k, random.Random(9)) for k in S3_KINDS] == [
        s3_fault(k, random.Random(9)) for k in S3_KINDS
    ]
