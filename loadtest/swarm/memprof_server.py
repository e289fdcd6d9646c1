"""The server side of ``--profile-memory``, run in a fresh interpreter as ``watch_swarm.py
--profile-server KIND PORT CONTROL_PORT [--trace]``.

Where does a WebSocket watcher's memory go in one server process? It serves watchers on
PORT: a raw asyncio WebSocket protocol (``lean``, :class:`LeanWs`), a bare aiohttp WebSocket
endpoint (``bare``) or evq's gateway app (``gateway``); and on CONTROL_PORT
``/_profile/mark`` (collect, remember the baseline), ``/_profile/report`` (the difference:
RSS, Python objects by type with their sizes, and with ``--trace`` the tracemalloc
allocation sites) and ``/_profile/gc`` (collections per generation).

Everything that runs in the profiled process is in this one module, because tracemalloc's
breakdown leaves out what was allocated here: the profiler's own samples, and with them the
lines of ``LeanWs`` and of the bare endpoint's handler (as it left out the whole tool when
the tool was one file).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from procstat import rss_bytes
from served import ROOT

from .common import KIB, WS_GUID

__all__ = ["LeanWs", "profile_server_main"]


def profile_server_main(argv: list[str]) -> int:
    """``--profile-server KIND PORT CONTROL_PORT [--trace]``: the server side of
    ``--profile-memory``: watchers on PORT, ``/_profile/*`` on CONTROL_PORT."""
    kind, port, control, trace = argv[0], int(argv[1]), int(argv[2]), "--trace" in argv
    if trace:
        import tracemalloc

        tracemalloc.start(1)
    workdir = Path(tempfile.mkdtemp(prefix="watch-profile-"))
    try:
        asyncio.run(_profile_serve(kind, port, control, trace, workdir))
    except KeyboardInterrupt:
        pass
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


async def _profile_serve(kind: str, port: int, control: int, trace: bool, workdir: Path) -> None:
    from aiohttp import web

    marks: dict[str, Any] = {}

    async def mark(request: web.Request) -> web.Response:
        marks.update(_profile_sample(trace))
        return web.json_response({"rss": marks["rss"]})

    async def report(request: web.Request) -> web.Response:
        n = int(request.query["n"])
        top = int(request.query.get("top", "20"))
        return web.json_response(_profile_diff(marks, _profile_sample(trace), n, top))

    async def gc_stats(request: web.Request) -> web.Response:
        import gc

        return web.json_response([s["collections"] for s in gc.get_stats()])

    ctl = web.Application()
    ctl.router.add_get("/_profile/gc", gc_stats)
    ctl.router.add_get("/_profile/mark", mark)
    ctl.router.add_get("/_profile/report", report)
    runners = [web.AppRunner(ctl, access_log=None)]
    if kind == "lean":
        loop = asyncio.get_running_loop()
        server = await loop.create_server(LeanWs, "127.0.0.1", port, backlog=4096)
    else:
        if kind == "gateway":  # as evq serve runs it: through the front door
            from gateway.door import DoorRunner

            runners.append(DoorRunner(_profile_gateway_app(workdir), access_log=None))
        else:
            runners.append(web.AppRunner(_profile_bare_app(), access_log=None))
    for runner, p in zip(runners, (control, port), strict=False):
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", p, backlog=4096).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    if kind == "lean":
        server.close()
    for runner in runners:
        await runner.cleanup()


class LeanWs(asyncio.Protocol):
    """The least a WebSocket watcher needs on an asyncio server: handshake, unmask frames,
    answer ``ping`` ops (a measure of what a connection costs without aiohttp's machinery)."""

    __slots__ = ("buf", "open", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buf = self.buf + data if self.buf else data
        if not self.open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            i = buf.lower().find(b"sec-websocket-key:")
            key = buf[i + 18 : buf.find(b"\r\n", i)].strip()
            accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
            self.transport.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % accept
            )
            self.open, buf = True, buf[end + 4 :]
        while len(buf) >= 6:
            ln, hl = buf[1] & 0x7F, 2
            if ln == 126:
                ln, hl = int.from_bytes(buf[2:4], "big"), 4
            if len(buf) < hl + 4 + ln:
                break
            mask, payload = buf[hl : hl + 4], buf[hl + 4 : hl + 4 + ln]
            rep = (mask * (ln // 4 + 1))[:ln]
            text = (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(ln, "big")
            if b'"ping"' in text:
                self.transport.write(b"\x81\x14" + b'{"op":"pong","id":1}')
            buf = buf[hl + 4 + ln :]
        self.buf = buf


def _profile_bare_app() -> Any:
    from aiohttp import WSMsgType, web

    async def ws_handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False, max_msg_size=64 * 1024)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT and '"ping"' in msg.data:
                await ws.send_str('{"op":"pong","id":1}')
        return ws

    app = web.Application()
    app.router.add_get("/v1/ws", ws_handler)
    return app


def _profile_gateway_app(workdir: Path) -> Any:
    from actors.directory import LocalDirectory
    from actors.log.stores import open_store
    from gateway.app import make_app

    return make_app(LocalDirectory(open_store(str(workdir)), count=1))


def _profile_sample(trace: bool) -> dict[str, Any]:
    import gc

    t0 = time.perf_counter()
    gc.collect()
    gc_ms = (time.perf_counter() - t0) * 1000
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        if isinstance(obj, Counter):  # the profiler's own samples
            continue
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    sample: dict[str, Any] = {
        "rss": rss_bytes(os.getpid()),
        "gc_ms": gc_ms,
        "counts": counts,
        "sizes": sizes,
    }
    if trace:
        import tracemalloc

        mine = tracemalloc.Filter(False, __file__)  # not this profiler's own samples
        sample["snapshot"] = tracemalloc.take_snapshot().filter_traces([mine])
    return sample


def _profile_diff(a: dict[str, Any], b: dict[str, Any], n: int, top: int) -> dict[str, Any]:
    counts = b["counts"] - a["counts"]
    sizes = b["sizes"] - a["sizes"]
    doc: dict[str, Any] = {
        "connections": n,
        "rss_per_conn_kib": round((b["rss"] - a["rss"]) / n / KIB, 2),
        "gc_objects_per_conn": round(sum(counts.values()) / n, 1),
        "full_gc_ms": {"before": round(a["gc_ms"], 1), "after": round(b["gc_ms"], 1)},
        "gc_bytes_per_conn_kib": round(sum(sizes.values()) / n / KIB, 2),
        "by_type": [
            {
                "type": name,
                "per_conn": round(counts[name] / n, 2),
                "bytes_per_conn": round(size / n),
            }
            for name, size in sizes.most_common(top)
        ],
    }
    if "snapshot" in b:
        diff = b["snapshot"].compare_to(a["snapshot"], "lineno")
        doc["traced_per_conn_kib"] = round(sum(d.size_diff for d in diff) / n / KIB, 2)
        doc["by_line"] = [
            {
                "where": f"{_short_path(d.traceback[0].filename)}:{d.traceback[0].lineno}",
                "bytes_per_conn": round(d.size_diff / n),
                "blocks_per_conn": round(d.count_diff / n, 2),
            }
            for d in sorted(diff, key=lambda d: -d.size_diff)[:top]
        ]
        by_file = b["snapshot"].compare_to(a["snapshot"], "filename")
        doc["by_file"] = [
            {"file": _short_path(d.traceback[0].filename), "bytes_per_conn": round(d.size_diff / n)}
            for d in sorted(by_file, key=lambda d: -d.size_diff)[:top]
        ]
    return doc


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
        i = path.find(marker)
        if i >= 0:
            return path[i + len(marker) :].lstrip("/")
    return path
