"""``evq serve --tls-cert --tls-key``: every route family over HTTPS on the one port, verified
against a private CA — the native API (aiohttp's routes and the fast path), the Python
clients and the CLI, SQS through boto3, WebSocket and long-poll watches, ``/metrics`` — with
the gateway-shard channel sealed as in a cluster (``--seal-channel``), and a certificate
rotated under load (files replaced, and SIGHUP) with no failed request."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import boto3
import pytest
from botocore.config import Config
from cryptography import x509

from actors.errors import QueueError
from evq.client import AsyncClient, Client, TransportError, tls_context
from loadtest.tlscerts import Authority, Issued
from tests.integration.server import EVQ, ROOT, Server, eventually, server_env
from tests.integration.test_sqs_server import BIN, KEY, SECRET, TASKS, cli_env
from tests.unit.gateway.sqs_support import unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOST = "127.0.0.1"


class Tls:
    def __init__(self, root: Path) -> None:
        self.ca = Authority(root / "ca")
        self.pair: Issued = self.ca.issue()
        self.server = Server(
            root / "data",
            "--tls-cert",
            str(self.pair.cert),
            "--tls-key",
            str(self.pair.key),
            "--shards",
            "1",
            "--seal-channel",  # and the gateway-shard channel sealed, as in a cluster
            ca_bundle=self.ca.bundle,
        )

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            HOST, self.server.port, timeout=30, context=tls_context(str(self.ca.bundle))
        )

    def serial(self) -> int:
        """The serial of the certificate a new connection is shown."""
        conn = self.connection()
        try:
            conn.connect()
            assert conn.sock is not None
            der = conn.sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
            return int(x509.load_der_x509_certificate(der).serial_number)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    setup = Tls(tmp_path_factory.mktemp("tls"))
    setup.server.start()
    try:
        yield setup
    finally:
        setup.server.stop()


def _ask(
    conn: http.client.HTTPConnection, method: str, path: str, doc: Any = None
) -> tuple[int, Any, http.client.HTTPResponse]:
    body = json.dumps(doc).encode() if doc is not None else None
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    return resp.status, (json.loads(raw) if raw else None), resp


def test_the_native_api_and_the_fast_path_answer_over_https(tls: Tls) -> None:
    conn = tls.connection()
    status, _, resp = _ask(conn, "PUT", "/v1/queues/tls-native", {})
    assert status in (200, 201)
    assert resp.getheader("Server")
    fast = tls.connection()
    put_doc = {"messages": [{"body": "hi"}]}
    status, put, resp = _ask(fast, "POST", "/v1/queues/tls-native/messages", put_doc)
    assert status in (200, 201), put
    assert resp.getheader("Server") is None  # the fast path wrote it, over TLS
    status, took, _ = _ask(fast, "POST", "/v1/queues/tls-native/take", {"max": 1})
    assert status == 200
    assert len(took["messages"]) == 1
    [msg] = took["messages"]
    items = {"items": [{"id": msg["id"], "lease": msg["lease"]}]}
    status, acked, _ = _ask(fast, "POST", "/v1/queues/tls-native/ack", items)
    assert status == 200
    assert acked["results"][0]["status"] == "ok"
    status, stats, _ = _ask(conn, "GET", "/v1/queues/tls-native")
    assert status == 200
    assert stats["name"] == "tls-native"
    for c in (conn, fast):
        c.close()


def test_the_clients_verify_the_server_with_the_ca_bundle(tls: Tls) -> None:
    url = tls.server.url
    with Client(url, ca_bundle=str(tls.ca.bundle)) as client:
        client.create_queue("tls-client")
        client.put("tls-client", b"one")
        [msg] = client.take("tls-client", max=1)
        assert client.ack("tls-client", msg)[0].status == "ok"

    async def run() -> bytes:
        async with AsyncClient(url, ca_bundle=str(tls.ca.bundle)) as aclient:
            await aclient.put("tls-client", b"two")
            [m] = await aclient.take("tls-client", max=1)
            await aclient.ack("tls-client", m)
            return bytes(m.body)

    assert asyncio.run(run()) == b"two"
    # Without the CA: the server is not believed (the system's CAs do not know it).
    saved = os.environ.pop("EVQ_CA_BUNDLE", None)
    try:
        with Client(url, retries=0) as stranger, pytest.raises(TransportError) as refused:
            stranger.get_queue("tls-client")
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    finally:
        if saved is not None:
            os.environ["EVQ_CA_BUNDLE"] = saved


def test_the_cli_takes_the_ca_bundle_by_option_and_environment(tls: Tls) -> None:
    def evq(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        command = [*EVQ, "--server", tls.server.url, *args]
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    plain = server_env()
    plain.pop("EVQ_CA_BUNDLE", None)
    done = evq("--ca-bundle", str(tls.ca.bundle), "create", "tls-cli", env=plain)
    assert done.returncode == 0, done.stderr
    done = evq("put", "tls-cli", "hello", env={**plain, "EVQ_CA_BUNDLE": str(tls.ca.bundle)})
    assert done.returncode == 0, done.stderr
    done = evq("stats", "tls-cli", env=plain)  # no CA: refused, clearly
    assert done.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr


def test_sqs_through_boto3_with_a_private_ca(tls: Tls) -> None:
    sqs = boto3.client(
        "sqs",
        endpoint_url=tls.server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        verify=str(tls.ca.bundle),
        config=Config(retries={"max_attempts": 1}),
    )
    url = sqs.create_queue(QueueName="tls-sqs")["QueueUrl"]
    assert url.startswith("https://")  # queue URLs say how the server was reached
    sqs.send_message(QueueUrl=url, MessageBody="over tls")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["over tls"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    unverified = boto3.client(
        "sqs",
        endpoint_url=tls.server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|SSL"):
        unverified.list_queues()


def test_watches_over_websocket_and_long_poll_and_metrics_over_https(tls: Tls) -> None:
    url, context = tls.server.url, tls_context(str(tls.ca.bundle))

    async def run() -> None:
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.ws_connect(f"{url}/v1/ws") as ws:
                await ws.send_json({"op": "watch", "key": "tls-ws", "version": 0})
                async with session.put(f"{url}/v1/keys/tls-ws", json={"value": 1}) as r:
                    assert r.status == 200
                event = await asyncio.wait_for(ws.receive_json(), 30)
                assert (event["op"], event["key"], event["value"]) == ("event", "tls-ws", 1)
            poll = session.get(f"{url}/v1/watch/tls-lp?version=0&timeout=30")
            waiting = asyncio.ensure_future(poll.__aenter__())
            await asyncio.sleep(0.3)
            async with session.put(f"{url}/v1/keys/tls-lp", json={"value": "x"}) as r:
                assert r.status == 200
            answer = await asyncio.wait_for(waiting, 30)
            assert answer.status == 200
            assert (await answer.json())["value"] == "x"
            answer.release()
            async with session.get(f"{url}/") as r:  # the dashboard's page
                assert r.status == 200
                assert "<html" in (await r.text()).lower()
            async with session.get(f"{url}/metrics") as r:
                assert r.status == 200
                assert "evq_" in await r.text()

    asyncio.run(run())


def test_plain_http_on_the_https_port_is_not_served(tls: Tls) -> None:
    conn = http.client.HTTPConnection(HOST, tls.server.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            _ask(conn, "GET", "/v1/queues")
    finally:
        conn.close()


def test_a_certificate_rotated_under_load_fails_no_request(tls: Tls) -> None:
    """Keep-alive clients and a client that connects for every request run while the pair is
    replaced twice (the file watch) and once more with SIGHUP: no request fails, and new
    connections show each new certificate."""
    bundle = str(tls.ca.bundle)
    with Client(tls.server.url, ca_bundle=bundle) as admin:
        admin.create_queue("tls-rotate")
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def keep_alive() -> None:
        with Client(tls.server.url, ca_bundle=bundle, retries=0) as client:
            while not stop.is_set():
                try:
                    client.put("tls-rotate", b"x")
                    done[0] += 1
                except QueueError as exc:
                    errors.append(exc)

    def new_connections() -> None:
        while not stop.is_set():
            try:
                with Client(tls.server.url, ca_bundle=bundle, retries=0) as client:
                    client.put("tls-rotate", b"y")
                    done[0] += 1
            except QueueError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=f) for f in (keep_alive, keep_alive, new_connections)]
    for t in threads:
        t.start()
    try:
        for _ in range(2):
            time.sleep(1.0)
            pair = tls.ca.issue()  # the same files, replaced: the watch reloads them
            eventually(lambda p=pair: tls.serial() == p.serial, timeout=20)
        time.sleep(0.5)
        # SIGHUP: the key and certificate are read again at once
        pair = tls.ca.issue()
        os.kill(tls.server.pid, signal.SIGHUP)
        eventually(lambda: tls.serial() == pair.serial, timeout=20)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]
    assert done[0] > 50
    assert tls.server.running()
    assert tls.server.log(whole=True).count("certificate reloaded") >= 3


def test_the_aws_cli_and_celery_over_https_with_a_private_ca(tls: Tls, tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    aws = [str(BIN / "aws"), "--endpoint-url", tls.server.url, "--output", "json"]

    def cli(*args: str, bundle: bool = True) -> subprocess.CompletedProcess[str]:
        extra = ["--ca-bundle", str(tls.ca.bundle)] if bundle else []
        return subprocess.run(
            [*aws, *extra, "sqs", *args], env=env, capture_output=True, text=True, timeout=60
        )

    done = cli("create-queue", "--queue-name", "tls-awscli")
    assert done.returncode == 0, done.stderr
    url = json.loads(done.stdout)["QueueUrl"]
    assert url.startswith("https://")
    assert cli("send-message", "--queue-url", url, "--message-body", "hi").returncode == 0
    got = json.loads(cli("receive-message", "--queue-url", url).stdout)["Messages"]
    assert [m["Body"] for m in got] == ["hi"]
    refused = cli("list-queues", bundle=False)  # the system's CAs do not know ours
    assert refused.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr or "SSL" in refused.stderr

    # Celery's SQS transport (kombu, botocore): https to the broker, our CA in AWS_CA_BUNDLE
    (tmp_path / "celery_tasks.py").write_text(TASKS)
    out = tmp_path / "out.txt"
    env.update(
        EVQ_TEST_OUT=str(out),
        EVQ_TEST_PREFIX=unique("tls-celery") + "-",
        EVQ_TEST_BROKER=f"sqs://{KEY}:{quote(SECRET, safe='')}@{HOST}:{tls.server.port}",
        EVQ_TEST_HTTPS="1",
        AWS_CA_BUNDLE=str(tls.ca.bundle),
        PYTHONPATH=str(tmp_path),
    )
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_tasks", "worker", "--pool=solo",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        producer = "import celery_tasks as t; t.add.delay(20, 22)"
        subprocess.run(
            [sys.executable, "-c", producer], cwd=tmp_path, env=env, check=True, timeout=60
        )
        eventually(
            lambda: out.exists() and "add 42" in out.read_text(),
            timeout=60,
            what=lambda: (tmp_path / "worker.log").read_text()[-3000:],
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
        log.close()
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


def test_every_gateway_process_serves_https_and_reloads_on_sighup(tmp_path: Path) -> None:
    """With --workers 2 each gateway process has its own context: both serve the pair, and a
    SIGHUP to the server reaches both (the main process passes it on)."""
    ca = Authority(tmp_path / "ca")
    pair = ca.issue()
    server = Server(
        tmp_path / "data",
        *("--tls-cert", str(pair.cert), "--tls-key", str(pair.key)),
        *("--workers", "2", "--shards", "1"),
        ca_bundle=ca.bundle,
    )
    server.start()
    try:
        with Client(server.url, ca_bundle=str(ca.bundle)) as client:
            client.create_queue("tls-workers")
        for _ in range(20):  # new connections: the kernel spreads them over both processes
            with Client(server.url, ca_bundle=str(ca.bundle), retries=0) as client:
                client.put("tls-workers", b"x")
        fresh = ca.issue()
        os.kill(server.pid, signal.SIGHUP)
        eventually(
            lambda: server.log().count("certificate reloaded") >= 2,
            timeout=30,
            what=lambda: server.log(lines=50),
        )
        for _ in range(20):
            with Client(server.url, ca_bundle=str(ca.bundle), retries=0) as client:
                assert client.put("tls-workers", b"y")
        assert fresh.serial != pair.serial
        assert server.running()
    finally:
        server.stop()
