"""The shared harness's HTTP adapter (``../shared/bench/adapters/http_json.py``) over HTTPS.

Its raw client (a minimal HTTP/1.1 keep-alive protocol, several times cheaper than aiohttp's
client on 2 cores) opens plain TCP only; this subclass opens the same protocol over TLS when
the target is ``https://`` (verifying the server with the default context: the CA given by
``SSL_CERT_FILE``), and is the plain adapter otherwise, so that HTTPS and HTTP are measured
with the same client code. ``loadtest/ab_serve.py`` loads it as ``tls_adapter:TlsJsonAdapter``
with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import urlsplit

from adapters.http_json import HttpJsonAdapter, _RawHttp  # the harness's (cwd: shared/bench)


class TlsJsonAdapter(HttpJsonAdapter):  # type: ignore[misc]
    name = "http_json_tls"

    async def open(self, role: Any) -> None:
        target = urlsplit(self.target)
        if target.scheme != "https" or self.opts.get("client", "raw") != "raw":
            await super().open(role)
            return
        self.vis = float(self.opts.get("visibility_s", 30))
        self.timeout = float(self.opts.get("timeout_s", 30))
        self.u_put, self.u_take, self.u_ack = (
            self._url("/messages"),
            self._url("/take"),
            self._url("/ack"),
        )
        self.raw = True
        port = target.port or 443
        _, self.p = await asyncio.get_running_loop().create_connection(
            _RawHttp,
            target.hostname,
            port,
            ssl=ssl.create_default_context(),
            server_hostname=target.hostname,
        )
        host = f"\r\nHost: {target.hostname}:{port}".encode()
        self.req = {
            url: urlsplit(url).path.encode() + b" HTTP/1.1" + host
            for url in (self.u_put, self.u_take, self.u_ack)
        }
