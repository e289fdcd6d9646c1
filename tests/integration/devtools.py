"""Headless Chromium driven over the DevTools protocol, with nothing but aiohttp.

:class:`Chromium` runs Debian's ``chromium`` in a session of its own with
``--remote-debugging-port=0`` and reads the port it chose from ``DevToolsActivePort`` in
its profile directory. :class:`Page` opens a tab (``Target.createTarget`` on the browser's
endpoint), talks to it over its own WebSocket, evaluates JavaScript, waits for conditions,
takes screenshots, and keeps the page's uncaught exceptions and console errors.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

LAUNCH_TIMEOUT_S = 30.0


def chromium_binary() -> str:
    """Debian's chromium (``make chromium`` installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Debian's chromium is needed: make chromium (apt-get install -y chromium)"
    return found


class Chromium:
    """One headless Chromium process and its DevTools port on 127.0.0.1."""

    def __init__(self, profile: Path, *, width: int = 1280, height: int = 900) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.profile = profile
        self.log_path = profile.parent / f"{profile.name}.log"
        args = [
            chromium_binary(),
            "--headless",
            "--no-sandbox",  # tests run as root in a container
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"chromium exited ({self.proc.returncode}): {self.log()}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(active.read_text().splitlines()[0])
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"chromium did not open its DevTools port: {self.log()}")

    def log(self) -> str:
        """The browser's own output (for failure messages)."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        """Stop the browser, then whatever it left in its session (renderers, zygotes)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session we started; nothing else


class Page:
    """One browser tab, driven over its DevTools WebSocket."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self.target_id = ""
        self.errors: list[str] = []  # uncaught exceptions and console errors of the page
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, browser: Chromium) -> Page:
        """A new blank tab of ``browser``, with console and exceptions reported."""
        http = aiohttp.ClientSession()
        base = f"http://127.0.0.1:{browser.port}"
        try:
            async with http.get(f"{base}/json/version") as resp:
                endpoint = (await resp.json())["webSocketDebuggerUrl"]
            async with http.ws_connect(endpoint, max_msg_size=0) as control:
                await control.send_json(
                    {"id": 1, "method": "Target.createTarget", "params": {"url": "about:blank"}}
                )
                answer = await asyncio.wait_for(control.receive_json(), 10)
            target = answer["result"]["targetId"]
            ws = await http.ws_connect(
                f"ws://127.0.0.1:{browser.port}/devtools/page/{target}", max_msg_size=0
            )
        except BaseException:
            await http.close()
            raise
        page = cls(http, ws)
        page.target_id = target
        await page.call("Runtime.enable")
        await page.call("Log.enable")
        await page.call("Page.enable")
        return page

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            doc = msg.json()
            fut = self._pending.pop(doc.get("id", -1), None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(doc)
                continue
            self._on_event(doc.get("method", ""), doc.get("params", {}))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the DevTools connection closed"))

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(f"console.error: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result."""
        call_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        doc = await asyncio.wait_for(fut, 15)
        if "error" in doc:
            raise AssertionError(f"{method}: {doc['error']}")
        return doc["result"]  # type: ignore[no-any-return]

    async def navigate(self, url: str) -> None:
        result = await self.call("Page.navigate", url=url)
        assert "errorText" not in result, result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, within: float = 10.0) -> Any:
        """Evaluate ``expression`` until it is truthy; fail after ``within`` seconds."""
        deadline = time.monotonic() + within
        value = None
        while time.monotonic() < deadline:
            with contextlib.suppress(AssertionError):  # e.g. the page is still loading
                value = await self.evaluate(expression)
                if value:
                    return value
            await asyncio.sleep(0.1)
        raise AssertionError(f"not true within {within}s: {expression} (last: {value!r})")

    async def screenshot(self) -> bytes:
        """A PNG of the page, as wide as the window and as tall as the content."""
        size = await self.evaluate(
            "({width: document.documentElement.clientWidth,"
            " height: Math.ceil(document.body.getBoundingClientRect().bottom)})"
        )
        result = await self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        return base64.b64decode(result["data"])

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.call("Page.close"), 5)
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.http.close()
