"""The ObjectStore contract, run against every implementation; then what only one has.

No mocks of stores: real files, real obstore, a real S3 server (moto) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from obstore.store import GCSStore, LocalStore, S3Store

from actors.errors import BadRequest, ErrorKind
from actors.log.faults import FaultSchedule, FaultyStore, Injected
from actors.log.obstore_store import ObstoreStore, s3_config
from actors.log.store import (
    KeyNotFound,
    LocalDirStore,
    ObjectStore,
    StoreError,
    check_key,
)
from actors.log.stores import open_store
from tests.conftest import CREDENTIALS, REGION, S3Server, free_port

MIB = 1024 * 1024
REPO = Path(__file__).resolve().parents[3]


def body(size: int, seed: int = 0) -> bytes:
    """Deterministic incompressible bytes."""
    return random.Random(seed).randbytes(size)


# ================================================================ the contract


async def test_put_if_absent_creates_once_and_keeps_the_first_bytes(store: ObjectStore) -> None:
    assert await store.put_if_absent("k", b"first") is True
    assert await store.put_if_absent("k", b"second") is False
    assert await store.get("k") == b"first"


async def test_put_if_absent_with_the_same_bytes_again_is_false(store: ObjectStore) -> None:
    assert await store.put_if_absent("k", b"same") is True
    assert await store.put_if_absent("k", b"same") is False
    assert await store.get("k") == b"same"


@pytest.mark.parametrize("size", [0, 1, 5 * MIB], ids=["empty", "1B", "5MiB"])
async def test_get_returns_exactly_what_was_put(store: ObjectStore, size: int) -> None:
    data = body(size, seed=size)
    assert await store.put_if_absent("obj", data)
    got = await store.get("obj")
    assert type(got) is bytes
    assert got == data


async def test_get_of_a_missing_key_raises_key_not_found(store: ObjectStore) -> None:
    await store.put_if_absent("a/b", b"x")
    for key in ["missing", "a/missing", "a/b/c", "a"]:
        with pytest.raises(KeyNotFound) as info:
            await store.get(key)
        assert info.value.kind is ErrorKind.NOT_FOUND
        assert info.value.fields["key"] == key


async def test_list_by_prefix_is_sorted(store: ObjectStore) -> None:
    keys = [
        "queues/q1/log/00000010",
        "queues/q1/log/00000002",
        "queues/q1/log/00010000",
        "queues/q1/snap/00000005",
        "queues/q10/log/00000001",
        "queues/q2/log/00000001",
        "top",
    ]
    for i, key in enumerate(random.Random(7).sample(keys, len(keys))):
        assert await store.put_if_absent(key, str(i).encode())
    assert await store.list("") == sorted(keys)
    assert await store.list("queues/q1/log/") == [
        "queues/q1/log/00000002",
        "queues/q1/log/00000010",
        "queues/q1/log/00010000",
    ]
    # Mid-name prefixes, as the log uses to find segments by sequence number.
    assert await store.list("queues/q1/log/0000") == [
        "queues/q1/log/00000002",
        "queues/q1/log/00000010",
    ]
    assert await store.list("queues/q1") == [k for k in sorted(keys) if k.startswith("queues/q1")]
    assert await store.list("queues/q1/") == sorted(k for k in keys if k.startswith("queues/q1/"))
    assert await store.list("to") == ["top"]
    assert await store.list("top") == ["top"]  # a full key is its own prefix
    assert await store.list("queues/q1/log/00000002") == ["queues/q1/log/00000002"]
    assert await store.list("queues/q3") == []
    assert await store.list("nothing/here/") == []


async def test_list_of_an_empty_store_is_empty(store: ObjectStore) -> None:
    assert await store.list("") == []
    assert await store.list("queues/q1/log/0000") == []


async def test_delete_removes_and_is_idempotent(store: ObjectStore) -> None:
    await store.put_if_absent("d/one", b"1")
    await store.put_if_absent("d/two", b"2")
    await store.delete("d/one")
    with pytest.raises(KeyNotFound):
        await store.get("d/one")
    assert await store.list("d/") == ["d/two"]
    await store.delete("d/one")  # again
    await store.delete("never/existed")
    assert await store.get("d/two") == b"2"
    # The key can be created again.
    assert await store.put_if_absent("d/one", b"again") is True
    assert await store.get("d/one") == b"again"


async def test_put_creates_and_overwrites(store: ObjectStore) -> None:
    await store.put("report/latest", b"v1")
    assert await store.get("report/latest") == b"v1"
    await store.put("report/latest", b"version two, longer")
    assert await store.get("report/latest") == b"version two, longer"
    await store.put("report/latest", b"")
    assert await store.get("report/latest") == b""
    assert await store.put_if_absent("report/latest", b"v3") is False
    assert await store.list("report/") == ["report/latest"]


async def test_nested_keys_are_independent(store: ObjectStore) -> None:
    keys = ["a/b/c/d/e/f", "a/b/c/x", "a/y", "b", "queues/q-1.x_y/log/00000000000000000001"]
    for key in keys:
        assert await store.put_if_absent(key, key.encode())
    for key in keys:
        assert await store.get(key) == key.encode()
    assert await store.list("a/b/c/") == ["a/b/c/d/e/f", "a/b/c/x"]


async def test_racing_put_if_absent_has_exactly_one_winner(store: ObjectStore) -> None:
    payloads = [f"writer {i}".encode() * (i + 1) for i in range(20)]
    results = await asyncio.gather(*(store.put_if_absent("race/k", p) for p in payloads))
    winners = [i for i, won in enumerate(results) if won]
    assert len(winners) == 1, results
    assert await store.get("race/k") == payloads[winners[0]]


BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "a/../b",
    "..",
    "./a",
    "a/./b",
    "nul\x00byte",
    ".tmp/x",
    "x" * 1025,
]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_bad_keys_are_refused_before_any_io(store: ObjectStore, key: str) -> None:
    calls = [
        lambda: store.get(key),
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.put(key, b"x"),
        lambda: store.delete(key),
    ]
    for call in calls:
        with pytest.raises(BadRequest):
            await call()
    assert await store.list("") == []


@pytest.mark.parametrize("prefix", ["/a", "a//", "../a", "a/../", "nul\x00", ".tmp/"])
async def test_bad_prefixes_are_refused(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(BadRequest):
        await store.list(prefix)


def test_check_key_accepts_what_the_log_uses() -> None:
    assert check_key("queues/q1/log/00000001") == "queues/q1/log/00000001"
    assert check_key("..x/.tmpx/a..b") == "..x/.tmpx/a..b"
    assert check_key("", prefix=True) == ""
    assert check_key("queues/q1/log/0000", prefix=True) == "queues/q1/log/0000"
    assert check_key("queues/", prefix=True) == "queues/"
    assert check_key(".tm", prefix=True) == ".tm"


# ================================================================ LocalDirStore only

# Each racer writes every key, in its own random order, several at a time: the two processes
# meet on keys at unpredictable moments instead of one trailing the other.
RACER = """
import asyncio, random, sys
from actors.log.store import LocalDirStore

async def main(root: str, me: str, n: int) -> None:
    store = LocalDirStore(root, max_threads=8)
    order = random.Random(me).sample(range(n), n)
    print("ready", flush=True)
    sys.stdin.readline()
    results = await asyncio.gather(
        *(store.put_if_absent(f"race/{i % 7}/k{i}", me.encode()) for i in order)
    )
    await store.close()
    print(" ".join(str(i) for i, won in zip(order, results) if won), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_processes_racing_on_the_same_keys_have_one_winner_each(tmp_path: Path) -> None:
    root, n = tmp_path / "store", 1000
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(root), name, str(n)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("alpha", "beta")
    ]
    try:
        for p in racers:  # both ready before either starts: the writes overlap
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for p in racers:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=45)[0] for p in racers]
    finally:
        for p in racers:
            p.kill()
    assert [p.returncode for p in racers] == [0, 0]
    won = [set(map(int, out.split())) for out in outputs]
    assert won[0].isdisjoint(won[1])
    assert won[0] | won[1] == set(range(n))
    for name, mine in zip(("alpha", "beta"), won, strict=True):
        for i in mine:
            assert (root / "race" / str(i % 7) / f"k{i}").read_bytes() == name.encode()
    assert list((root / ".tmp").iterdir()) == []  # no temp file left behind


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, str]]:
    """Record fdatasync/fsync (with the path of the fd), link, replace and unlink under
    ``tmp_path``, in order, while still doing them: a spy, not a fake."""
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    base = str(tmp_path)

    def note(name: str, path: str) -> None:
        if path.startswith(base):
            with lock:
                events.append((name, path[len(base) :]))

    def wrap_fd(name: str):  # type: ignore[no-untyped-def]
        real = getattr(os, name)

        def spy(fd: int) -> None:
            note(name, os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        return spy

    def wrap_path(name: str, which: int):  # type: ignore[no-untyped-def]
        real = getattr(os, name)

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = real(*args, **kwargs)
            note(name, os.fspath(args[which]))
            return result

        return spy

    monkeypatch.setattr(os, "fdatasync", wrap_fd("fdatasync"))
    monkeypatch.setattr(os, "fsync", wrap_fd("fsync"))
    monkeypatch.setattr(os, "link", wrap_path("link", 1))
    monkeypatch.setattr(os, "replace", wrap_path("replace", 1))
    monkeypatch.setattr(os, "unlink", wrap_path("unlink", 0))
    return events


@pytest.mark.parametrize("op", ["put_if_absent", "put"])
async def test_writes_are_fsynced_before_and_after_they_become_visible(
    local_store: LocalDirStore, syscalls: list[tuple[str, str]], tmp_path: Path, op: str
) -> None:
    data = body(100_000)
    await getattr(local_store, op)("queues/q1/log/1", data)
    # The object is on disk, whole, when the call returns.
    assert (tmp_path / "store/queues/q1/log/1").read_bytes() == data

    publish = "link" if op == "put_if_absent" else "replace"
    names = [name for name, _ in syscalls]
    at = names.index(publish)
    assert syscalls[at] == (publish, "/store/queues/q1/log/1")
    # Data first: a crash must never expose a short file under the final name.
    synced_tmp = [p for n, p in syscalls[:at] if n == "fdatasync"]
    assert len(synced_tmp) == 1
    assert synced_tmp[0].startswith("/store/.tmp/")
    # Then the new entry, and the entry of every new directory on the way (the root included).
    assert ("fsync", "/store/queues/q1/log") in syscalls[at + 1 :]
    dirs_synced = {p for n, p in syscalls if n == "fsync"}
    assert {"", "/store", "/store/queues", "/store/queues/q1"} <= dirs_synced


async def test_delete_fsyncs_the_directory(
    local_store: LocalDirStore, syscalls: list[tuple[str, str]]
) -> None:
    await local_store.put_if_absent("a/b", b"x")
    syscalls.clear()
    await local_store.delete("a/b")
    assert syscalls == [("unlink", "/store/a/b"), ("fsync", "/store/a")]


async def test_directories_made_by_someone_else_are_made_durable_too(
    local_store: LocalDirStore, syscalls: list[tuple[str, str]]
) -> None:
    # Another process may have created them and not fsync'd their entries yet.
    (local_store.root / "queues/q1/log").mkdir(parents=True)
    await local_store.put_if_absent("queues/q1/log/1", b"x")
    dirs_synced = {p for n, p in syscalls if n == "fsync"}
    assert {"/store", "/store/queues", "/store/queues/q1", "/store/queues/q1/log"} <= dirs_synced


async def test_a_second_write_in_a_known_directory_syncs_only_that_directory(
    local_store: LocalDirStore, syscalls: list[tuple[str, str]]
) -> None:
    await local_store.put_if_absent("a/b/1", b"x")
    syscalls.clear()
    await local_store.put_if_absent("a/b/2", b"y")
    assert [(n, p) for n, p in syscalls if n == "fsync"] == [("fsync", "/store/a/b")]


async def test_temp_files_left_by_a_crash_are_never_seen(local_store: LocalDirStore) -> None:
    await local_store.put_if_absent("kept", b"ok")
    stale = local_store.root / ".tmp" / f"{os.getpid()}-0-deadbeef"
    stale.write_bytes(b"half a segm")  # as if we died between write and link
    assert await local_store.list("") == ["kept"]
    assert await local_store.list(".t") == []
    with pytest.raises(BadRequest):
        await local_store.get(f".tmp/{stale.name}")
    assert await local_store.put_if_absent("next", b"fine")  # a stale temp blocks nothing
    assert await local_store.list("") == ["kept", "next"]
    assert sorted(p.name for p in (local_store.root / ".tmp").iterdir()) == [stale.name]


async def test_a_key_cannot_be_both_an_object_and_a_directory(local_store: LocalDirStore) -> None:
    await local_store.put_if_absent("a/b", b"x")
    for op in (local_store.put_if_absent, local_store.put):
        with pytest.raises(BadRequest):
            await op("a", b"y")  # "a" is a directory here
        with pytest.raises(BadRequest):
            await op("a/b/c", b"y")  # "a/b" is a file here
    assert await local_store.list("") == ["a/b"]
    await local_store.delete("a/b")
    assert await local_store.put_if_absent("a/b/c", b"now a/b is a directory") is True


async def test_a_directory_removed_behind_the_stores_back_is_made_again(
    local_store: LocalDirStore,
) -> None:
    await local_store.put_if_absent("q/log/1", b"x")
    shutil.rmtree(local_store.root / "q")
    with pytest.raises(StoreError) as info:
        await local_store.put_if_absent("q/log/2", b"y")  # it trusted its cache once
    assert info.value.fields["ambiguous"] is False
    assert await local_store.put_if_absent("q/log/2", b"y") is True
    assert await local_store.list("q/") == ["q/log/2"]


async def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    st = LocalDirStore(tmp_path)
    await st.close()
    with pytest.raises(StoreError) as info:
        await st.get("k")
    assert info.value.fields["ambiguous"] is False


async def test_io_errors_become_store_errors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_bytes(b"a file where the root directory should be")
    st = LocalDirStore(root)
    try:
        with pytest.raises(StoreError) as info:
            await st.put_if_absent("k", b"x")
        assert info.value.fields["ambiguous"] is False  # failed before anything was visible
        assert info.value.kind is ErrorKind.UNAVAILABLE
    finally:
        await st.close()


# ================================================================ ObstoreStore only


async def test_delete_of_a_missing_key_is_quiet_where_the_backend_raises(tmp_path: Path) -> None:
    # S3 and memory answer OK for a missing key; obstore's LocalStore (and GCS) raise.
    st = ObstoreStore(LocalStore(tmp_path), tmp_path.as_uri())
    await st.delete("never/there")
    await st.put("k", b"v")
    await st.delete("k")
    await st.delete("k")
    assert await st.list("") == []


@pytest.mark.integration
async def test_a_create_put_whose_response_was_lost_reads_as_taken_with_our_bytes(
    s3_server: S3Server,
) -> None:
    """obstore retries a create-only PUT after a 503; when the first attempt landed, the
    retry's 412 makes put_if_absent return False although this call wrote the object.
    The log writer relies on reading the object back in that case."""
    upstream = s3_server.endpoint.removeprefix("http://")
    puts = []

    class LoseFirstPutResponse(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            conn = http.client.HTTPConnection(upstream, timeout=10)
            conn.request(self.command, self.path, self.rfile.read(length), dict(self.headers))
            reply = conn.getresponse()
            data = reply.read()
            conn.close()
            if self.command == "PUT":
                puts.append(reply.status)
                if len(puts) == 1:  # written upstream, but the client hears 503
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
            self.send_response(reply.status)
            for name, value in reply.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "server", "date"):
                    self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = do_DELETE = _forward

    proxy = ThreadingHTTPServer(("127.0.0.1", free_port()), LoseFirstPutResponse)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
        config, client = s3_config({}, {"endpoint": endpoint, "region": REGION, **CREDENTIALS})
        fast_retry = {
            "max_retries": 2,
            "backoff": {
                "init_backoff": timedelta(milliseconds=10),
                "max_backoff": timedelta(milliseconds=50),
                "base": 2,
            },
            "retry_timeout": timedelta(seconds=5),
        }
        inner = S3Store(
            s3_server.bucket,
            prefix="lost-ack",
            config=config,
            client_options=client,
            retry_config=fast_retry,
        )
        st = ObstoreStore(inner, "s3://lost-ack")
        assert await st.put_if_absent("seg/1", b"ours") is False
        assert puts == [200, 412]
        assert await st.get("seg/1") == b"ours"
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(5)


# ================================================================ FaultyStore


@pytest.fixture
async def memory() -> ObjectStore:
    return open_store("memory://")


@pytest.mark.fault
async def test_fail_put_fails_the_nth_write_before_writing(memory: ObjectStore) -> None:
    store = FaultyStore(memory).fail_put(2, 4)
    assert await store.put_if_absent("k1", b"1")
    with pytest.raises(StoreError) as info:
        await store.put("k2", b"2")  # put and put_if_absent share the count
    assert info.value.fields["ambiguous"] is False
    assert await store.put_if_absent("k3", b"3")
    with pytest.raises(StoreError):
        await store.put_if_absent("k4", b"4")
    assert await store.put_if_absent("k2", b"2")  # a retry is a new call and goes through
    assert await memory.list("") == ["k1", "k2", "k3"]
    assert store.injected == [
        Injected("put", 1, 2, "fail"),
        Injected("put_if_absent", 3, 4, "fail"),
    ]


@pytest.mark.fault
async def test_ack_lost_put_writes_then_reports_an_ambiguous_failure(memory: ObjectStore) -> None:
    store = FaultyStore(memory).ack_lost_put(1)
    with pytest.raises(StoreError) as info:
        await store.put_if_absent("seg", b"landed")
    assert info.value.fields["ambiguous"] is True
    assert await memory.get("seg") == b"landed"
    assert await store.put_if_absent("seg", b"landed") is False  # the retry finds it taken


@pytest.mark.fault
async def test_fail_other_operations_by_their_own_count(memory: ObjectStore) -> None:
    store = FaultyStore(memory).fail("list", 2).fail("get", 1)
    await store.put("k", b"v")
    assert await store.list("") == ["k"]
    with pytest.raises(StoreError):
        await store.list("")
    assert await store.list("") == ["k"]
    with pytest.raises(StoreError):
        await store.get("k")
    assert await store.get("k") == b"v"


@pytest.mark.fault
async def test_delay_holds_only_the_chosen_calls(memory: ObjectStore) -> None:
    store = FaultyStore(memory).delay("put_if_absent", 0.05, 1)
    start = time.perf_counter()
    slow = asyncio.create_task(store.put_if_absent("k", b"slow"))
    await asyncio.sleep(0)  # let the slow call start (and be numbered) first
    assert await store.put_if_absent("k", b"fast") is True  # overtakes the held call
    assert await slow is False
    assert time.perf_counter() - start >= 0.045  # timer slack; the order above is the point
    assert await store.get("k") == b"fast"
    assert store.injected == [Injected("put_if_absent", 1, 1, "delay")]


@pytest.mark.fault
async def test_delay_uses_the_injected_sleep(memory: ObjectStore) -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    store = FaultyStore(memory, FaultSchedule().delay("get", 30.0), sleep=fake_sleep)
    await store.put("k", b"v")
    assert [await store.get("k") for _ in range(3)] == [b"v"] * 3
    assert slept == [30.0, 30.0, 30.0]


@pytest.mark.fault
async def test_calls_are_counted_per_operation(memory: ObjectStore) -> None:
    store = FaultyStore(memory).fail_put(3)
    await store.put_if_absent("a", b"")
    await store.put("b", b"")
    with pytest.raises(StoreError):
        await store.put_if_absent("c", b"")
    await store.get("a")
    await store.list("")
    await store.delete("a")
    await store.delete("a")
    assert store.calls == {"put_if_absent": 2, "put": 1, "get": 1, "list": 1, "delete": 2}
    assert store.puts == 3
    assert store.url == memory.url


@pytest.mark.fault
def test_schedule_rejects_nonsense(memory: ObjectStore) -> None:
    store = FaultyStore(memory)
    with pytest.raises(ValueError, match="count from 1"):
        store.fail_put(0)
    with pytest.raises(ValueError, match="count from 1"):
        store.ack_lost_put()
    with pytest.raises(ValueError, match="unknown store operation"):
        store.delay("putt", 1.0)
    with pytest.raises(ValueError, match="negative"):
        store.delay("get", -1.0)


# ================================================================ open_store


async def test_open_store_with_a_path_or_file_url_is_local(tmp_path: Path) -> None:
    by_path = open_store(str(tmp_path / "a"))
    by_url = open_store((tmp_path / "a").as_uri())
    try:
        assert isinstance(by_path, LocalDirStore)
        assert isinstance(by_url, LocalDirStore)
        assert by_path.root == by_url.root == tmp_path / "a"
        assert by_url.url == (tmp_path / "a").as_uri()
        await by_path.put_if_absent("k", b"shared")
        assert await by_url.get("k") == b"shared"
    finally:
        await by_path.close()
        await by_url.close()


async def test_open_store_memory_is_a_fresh_obstore_store() -> None:
    one, two = open_store("memory://"), open_store("memory://")
    assert isinstance(one, ObstoreStore)
    await one.put_if_absent("k", b"v")
    assert await one.get("k") == b"v"
    assert await two.list("") == []


@pytest.mark.integration
async def test_open_store_s3_reads_the_aws_environment(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["secret_access_key"])
    st = open_store(f"s3://{s3_server.bucket}/from-env/")
    assert isinstance(st, ObstoreStore)
    assert st.url == f"s3://{s3_server.bucket}/from-env/"
    assert await st.put_if_absent("seg/1", b"via env") is True
    assert await st.list("seg/") == ["seg/1"]
    client = s3_server.boto3_client()
    try:  # the URL's path became the prefix inside the bucket
        obj = client.get_object(Bucket=s3_server.bucket, Key="from-env/seg/1")
        assert obj["Body"].read() == b"via env"
    finally:
        client.close()


@pytest.mark.integration
async def test_open_store_s3_explicit_options_beat_the_environment(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # obstore itself would let AWS_ENDPOINT_URL_S3 win over an endpoint= option.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    st = open_store(
        f"s3://{s3_server.bucket}/explicit",
        endpoint=s3_server.endpoint,
        region=REGION,
        access_key_id=CREDENTIALS["access_key_id"],
        secret_access_key=CREDENTIALS["secret_access_key"],
    )
    assert await st.put_if_absent("k", b"v") is True
    assert await st.get("k") == b"v"


def test_s3_config_prefers_options_then_specific_variables() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://generic:1",
        "AWS_ENDPOINT_URL_S3": "http://s3-specific:2",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "eu-west-2",
        "AWS_SESSION_TOKEN": "tok",
    }
    config, client = s3_config(env, {"access_key_id": "id"})
    assert config["endpoint"] == config["aws_endpoint_url_s3"] == "http://s3-specific:2"
    assert config["region"] == "eu-west-2"
    assert config["session_token"] == "tok"
    assert config["access_key_id"] == "id"
    assert config["virtual_hosted_style_request"] is False
    assert client == {"allow_http": True}
    config, client = s3_config({}, {"endpoint": "https://s3.example"})
    assert client == {}
    config, client = s3_config({}, {})
    # Nothing set: obstore's own defaults and credential chain apply.
    assert config == {}
    assert client == {}


def test_open_store_gs_takes_the_url_path_as_prefix() -> None:
    st = open_store("gs://some-bucket/a/b/")
    assert isinstance(st, ObstoreStore)
    assert isinstance(st.store, GCSStore)
    assert st.store.prefix == "a/b"


@pytest.mark.parametrize(
    ("target", "options"),
    [
        ("", {}),
        ("ftp://host/x", {}),
        ("http://host/x", {}),
        ("file://otherhost/x", {}),
        ("memory://", {"endpoint": "http://x"}),
        ("/some/dir", {"region": "eu-west-1"}),
        ("s3:///prefix-without-bucket", {}),
        ("s3://bucket/../escape", {}),
        ("s3://bucket/p", {"no_such_option": "1"}),
        ("s3://key:secret@bucket/p", {}),
    ],
)
def test_open_store_refuses_what_it_cannot_open(target: str, options: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        open_store(target, **options)
