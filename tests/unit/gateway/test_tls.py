"""TLS on the listener (gateway/tls.py): the pair loads or the start stops with a clear error
that names files, never their content; a rotated pair serves new connections while open ones
go on; a pair that does not load leaves the one in use; the file watch reloads by itself.
Also what a proxy in front may say (gateway/proxy.py) and the settings that turn both on."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from actors.errors import BadRequest
from evq.client import tls_context
from gateway.proxy import origin
from gateway.settings import ServerSettings
from gateway.tls import Certificates, TlsError
from loadtest.tlscerts import Authority


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


async def _serve(context: ssl.SSLContext) -> tuple[asyncio.AbstractServer, int]:
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


async def _connect(port: int, bundle: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=tls_context(str(bundle)))


def _serial(writer: asyncio.StreamWriter) -> int:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return int(x509.load_der_x509_certificate(der).serial_number)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await reader.readexactly(len(data))


async def test_a_rotated_pair_serves_new_connections_and_open_ones_go_on(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    first = ca.issue()
    certificates = Certificates(str(first.cert), str(first.key))
    server, port = await _serve(certificates.context)
    async with server:
        reader, writer = await _connect(port, ca.bundle)
        assert _serial(writer) == first.serial
        second = ca.issue()  # the same files, replaced
        assert certificates.changed()
        assert certificates.reload()
        assert not certificates.changed()
        assert await _echo(reader, writer, b"still here") == b"still here"
        reader2, writer2 = await _connect(port, ca.bundle)
        assert _serial(writer2) == second.serial
        assert await _echo(reader2, writer2, b"new") == b"new"
        for w in (writer, writer2):
            w.close()
    assert certificates.loads == 2


async def test_a_pair_that_does_not_load_leaves_the_one_in_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = Authority(tmp_path)
    first = ca.issue()
    certificates = Certificates(str(first.cert), str(first.key))
    other = ca.issue("other")
    key_text = other.key.read_text()
    first.key.write_text(key_text)  # a key that is not the certificate's
    assert not certificates.reload()
    assert "not reloaded" in caplog.text
    assert "PRIVATE KEY" not in caplog.text
    assert key_text[40:80] not in caplog.text
    first.cert.write_text("-----BEGIN CERTIFICATE-----\nhalf writ")
    assert not certificates.reload()
    server, port = await _serve(certificates.context)
    async with server:
        _, writer = await _connect(port, ca.bundle)
        assert _serial(writer) == first.serial  # still the first pair
        writer.close()
    assert certificates.loads == 1


def test_at_start_a_bad_pair_is_a_clear_error_naming_files_not_content(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    one, two = ca.issue("one"), ca.issue("two")
    with pytest.raises(TlsError, match="do not load as a certificate and its key") as bad:
        Certificates(str(one.cert), str(two.key))
    assert str(two.key) in str(bad.value)
    assert "PRIVATE" not in str(bad.value)
    with pytest.raises(TlsError, match="no such file"):
        Certificates(str(tmp_path / "missing.crt"), str(one.key))


async def test_the_file_watch_reloads_by_itself(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    first = ca.issue()
    certificates = Certificates(str(first.cert), str(first.key))
    watch = asyncio.ensure_future(certificates.watch(every_s=0.02))
    try:
        ca.issue()
        for _ in range(250):
            if certificates.loads == 2:
                break
            await asyncio.sleep(0.02)
        assert certificates.loads == 2
    finally:
        watch.cancel()


async def test_a_client_without_the_ca_refuses_the_server(tmp_path: Path) -> None:
    ca, stranger = Authority(tmp_path / "ca"), Authority(tmp_path / "other", "other CA")
    pair = ca.issue()
    server, port = await _serve(Certificates(str(pair.cert), str(pair.key)).context)
    async with server:
        with pytest.raises(ssl.SSLCertVerificationError):
            await _connect(port, stranger.bundle)
        with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know it
            await asyncio.open_connection("127.0.0.1", port, ssl=tls_context())


TRUSTED = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1/32")]


@pytest.mark.parametrize(
    ("remote", "proto", "chain", "expected"),
    [
        ("10.1.1.1", "https", "203.0.113.9", ("https", "203.0.113.9")),
        ("10.1.1.1", "HTTPS, http", "203.0.113.9, 10.2.2.2", ("https", "203.0.113.9")),
        # what the client wrote before the proxies' own entries is not believed
        ("10.1.1.1", "https", "6.6.6.6, 203.0.113.9, 10.2.2.2", ("https", "203.0.113.9")),
        ("10.1.1.1", "gopher", None, (None, None)),
        ("10.1.1.1", None, "10.2.2.2, 10.3.3.3", (None, "10.2.2.2")),  # all proxies
        ("192.0.2.7", "https", "203.0.113.9", (None, None)),  # not a proxy: ignored
        (None, "https", "203.0.113.9", (None, None)),
        ("not an address", "https", "203.0.113.9", (None, None)),
    ],
)
def test_only_a_trusted_proxy_says_where_a_request_came_from(
    remote: str | None,
    proto: str | None,
    chain: str | None,
    expected: tuple[str | None, str | None],
) -> None:
    assert origin(remote, proto, chain, TRUSTED) == expected


def test_the_settings_want_both_files_and_real_networks() -> None:
    assert ServerSettings().tls_files() is None
    assert ServerSettings(tls_cert="c", tls_key="k").tls_files() == ("c", "k")
    with pytest.raises(BadRequest, match="both a certificate"):
        ServerSettings(tls_cert="c").tls_files()
    with pytest.raises(BadRequest, match="not an address"):
        ServerSettings(trusted_proxies="10.0.0.0/8,proxy.example").proxy_networks()
    assert len(ServerSettings().proxy_networks()) == 2


def _serve_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    tokens = json.dumps(
        {"token": [{"name": "a", "token": "a-token-0123456789abcdef", "queues": {"*": "admin"}}]}
    )
    return subprocess.run(
        [sys.executable, "-m", "evq", "serve", "--no-ray", "--data", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "EVQ_TOKENS": tokens},
    )


def test_plain_http_off_loopback_is_refused_at_start_saying_what_to_set(tmp_path: Path) -> None:
    done = _serve_command(tmp_path, "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2
    assert "without TLS" in done.stderr
    for setting in ("--tls-cert", "--tls-key", "--behind-tls-proxy", "EVQ_TLS_CERT"):
        assert setting in done.stderr


def test_a_bad_pair_stops_the_start(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    one, two = ca.issue("one"), ca.issue("two")
    done = _serve_command(tmp_path, "--tls-cert", str(one.cert), "--tls-key", str(two.key))
    assert done.returncode == 2
    assert "do not load as a certificate and its key" in done.stderr
    assert "PRIVATE" not in done.stderr
    done = _serve_command(tmp_path, "--tls-cert", str(one.cert))
    assert done.returncode == 2
    assert "--tls-key" in done.stderr
