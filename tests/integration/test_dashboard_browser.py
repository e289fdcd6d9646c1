"""The dashboard in headless Chromium against the real app (LocalDirectory, real HTTP on
127.0.0.1): the page lists the queues, follows their counts through the server's watches
over WebSocket, draws their charts, and shows the recovery report. The DOM is read over the
DevTools protocol (tests/integration/devtools.py).

``EVQ_DASHBOARD_SCREENSHOT=docs/dashboard.png`` keeps the first test's screenshot there
(how docs/dashboard.png is made).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from PIL import Image

from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore
from actors.shard import placement
from gateway import watches
from gateway.app import AppOptions, make_app
from gateway.auth import Token
from tests.integration.devtools import Chromium, Page
from tests.unit.gateway.conftest import Api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Seen = list[tuple[str, str | None, str | None]]  # the browser's: (path, Authorization, ?token=)
Start = Callable[..., Awaitable[Api]]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    chromium = Chromium(tmp_path_factory.mktemp("chromium") / "profile")
    try:
        yield chromium
    finally:
        chromium.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Where the test's queues live (a restarted server finds them there)."""
    return tmp_path / "data"


@pytest.fixture
def seen() -> Seen:
    """What each request of the browser carried: path, Authorization header, token param."""
    return []


@pytest.fixture
async def start(aiohttp_client: Any, data_dir: Path, seen: Seen) -> AsyncIterator[Start]:
    """Start a ready gateway over ``data_dir`` (again: a restart) that records requests."""
    apis: list[Api] = []

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if "Chrome" in request.headers.get("User-Agent", ""):  # not the test's own calls
            auth = request.headers.get("Authorization")
            seen.append((request.path, auth, request.query.get("token")))
        return await handler(request)

    async def run(options: AppOptions | None = None) -> Api:
        app = make_app(LocalDirectory(LocalDirStore(data_dir), count=2), options or AppOptions())
        app.middlewares.insert(0, record)
        api = Api(await aiohttp_client(app))
        apis.append(api)
        await api.wait_ready()
        return api

    yield run
    for api in apis:
        api.raw.close()  # the hot commands' own connections


@pytest.fixture
async def page(browser: Chromium) -> AsyncIterator[Page]:
    tab = await Page.open(browser)
    try:
        yield tab
    finally:
        await tab.close()


def cell(queue: str, field: str) -> str:
    """JavaScript: the text of one count of a queue's row (null while there is no row)."""
    return (
        f'document.querySelector(\'tr[data-queue="{queue}"] td[data-field="{field}"]\')'
        "?.textContent"
    )


async def wait_cell(page: Page, queue: str, field: str, text: str, within: float = 10.0) -> None:
    await page.wait_for(f"{cell(queue, field)} === {json.dumps(text)}", within)


def ws_keys(api: Api) -> list[list[str]]:
    """The keys each WebSocket connection to the server watches."""
    hub = api.app[watches.HUB]
    return [sorted(hub.table.watched_keys(c)) for c in api.app[watches.WATCHERS].ws]


CHART_INK = """(() => {
  const c = document.querySelector('canvas[data-chart="orders"]');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i] > 30 && px[i + 1] > 120 && px[i + 2] < 110) n++;
  return n;  // pixels of the "ready" green
})()"""


SHARD = placement("orders", 2)
TORN = f"wal/{SHARD:04d}/{10**9:020d}.seg"  # far past the end of orders' shard log
SAMPLES = "+document.querySelector('canvas[data-chart=\"orders\"]').dataset.samples"
REPORT_ROW = "document.querySelector('tr[data-report=\"orders\"]')"
LOG_ROW = f"document.querySelector('tr[data-report=\"log-{SHARD}\"]')"
CLEAN_CELL = "document.querySelector('tr[data-report=\"orders\"] td.discarded').textContent"


async def restarted_with_a_torn_segment(start: Start, data_dir: Path) -> Api:
    """A server that recovered "orders" (2 ready) and "emails" (1 delayed) from a first
    server's log, with a torn segment discarded from orders' shard log."""
    first = await start()
    await first.create("orders")
    await first.put("orders", "a", "b")
    await first.create("emails")
    await first.put("emails", {"body": "later", "delay": 3600})
    await first.client.close()
    first.raw.close()
    (data_dir / TORN).write_bytes(b"a segment torn in its header")
    return await start()


async def check_recovery_report(page: Page, api: Api) -> None:
    """The page shows what each shard recovered, as /v1/status says."""
    status = await api.ok("GET", "/v1/status")
    reports = {r["queue"]: r for s in status["shards"] for r in s["reports"]}
    assert "emails" not in reports, reports  # deleted since: its report went with it
    orders = reports["orders"]
    assert orders["clean"], orders
    log = status["shards"][SHARD]["log"]
    assert [d["object"] for d in log["discarded"]] == [TORN], log
    await page.wait_for(f"{LOG_ROW}?.classList.contains('damaged')")
    text = await page.evaluate(f"{LOG_ROW}.textContent")
    assert f"{TORN} from byte 0" in text, text
    assert f"shard {SHARD} log" in text, text
    text = await page.evaluate(f"{REPORT_ROW}.textContent")
    assert f"seq {orders['snapshot_seq']}" in text, text
    assert await page.evaluate(CLEAN_CELL) == "nothing"
    assert await page.evaluate("document.querySelectorAll('#shards .shard').length") == 2
    assert await page.evaluate("document.getElementById('server').textContent") == "ready"


def keep_screenshot(png: bytes, tmp_path: Path) -> None:
    """Check the PNG; keep it (also as $EVQ_DASHBOARD_SCREENSHOT when set)."""
    image = Image.open(io.BytesIO(png))
    assert image.width >= 1000, image.size
    assert image.height >= 300, image.size
    (tmp_path / "dashboard.png").write_bytes(png)
    if keep := os.environ.get("EVQ_DASHBOARD_SCREENSHOT"):
        Path(keep).write_bytes(png)


async def test_the_page_follows_a_queue_through_watches_and_shows_the_recovery_report(
    start: Start, page: Page, seen: Seen, data_dir: Path, tmp_path: Path
) -> None:
    api = await restarted_with_a_torn_segment(start, data_dir)
    await page.navigate(str(api.client.make_url("/")) + "#window=30")  # charts: the last 30 s
    await page.wait_for("document.body.dataset.ws === 'open'")
    await wait_cell(page, "orders", "ready", "2")
    await wait_cell(page, "emails", "delayed", "1")
    status = await api.ok("GET", "/v1/status")
    clean = {r["queue"]: r["clean"] for s in status["shards"] for r in s["reports"]}
    assert clean == {"orders": True, "emails": True}, status["shards"]
    assert await page.evaluate(cell("orders", "total")) == "2"
    assert await page.evaluate("document.querySelector('th.chart').textContent") == "last 30 s"
    await page.evaluate("window.notReloaded = true")

    # A put: the count follows through the WebSocket watch (the page never polls stats).
    await api.put("orders", "c", "d", "e")
    await wait_cell(page, "orders", "ready", "5", within=5)
    taken = await api.take("orders", 2)
    await wait_cell(page, "orders", "reserved", "2", within=5)
    assert await page.evaluate(cell("orders", "ready")) == "3"
    # the counts, and the server's events that say when to read the list and the shards again
    assert ws_keys(api) == [["queue:emails", "queue:orders", "sys:queues", "sys:shards"]]
    assert seen, "no request of the browser was seen"
    assert not [p for p, _, _ in seen if p.startswith("/v1/queues/")], "stats were polled"

    # A queue created after the page loaded appears without a reload, one deleted goes.
    await api.create("invoices")
    await api.put("invoices", "x")
    await wait_cell(page, "invoices", "ready", "1", within=8)
    await api.ok("DELETE", "/v1/queues/emails", status=204)
    await page.wait_for("!document.querySelector('tr[data-queue=\"emails\"]')", within=8)
    assert await page.evaluate("window.notReloaded") is True
    assert await page.evaluate("document.querySelectorAll('#queues tbody tr').length") == 2

    # The chart holds every change and is drawn.
    await api.ack("orders", *taken)
    await wait_cell(page, "orders", "reserved", "0", within=5)
    assert await page.evaluate(SAMPLES) >= 4  # 2, 5, 3 + 2 reserved, 3
    assert await page.evaluate(CHART_INK) > 50

    await check_recovery_report(page, api)
    assert await page.evaluate("document.getElementById('problem').hidden") is True
    assert {a for _, a, _ in seen} == {None}, "no token in the URL: no credentials sent"
    assert page.errors == []
    keep_screenshot(await page.screenshot(), tmp_path)


async def test_a_token_in_the_fragment_is_sent_on_fetches_and_the_websocket(
    start: Start, page: Page, seen: Seen
) -> None:
    api = await start()
    await api.create("orders")
    await page.navigate(str(api.client.make_url("/")) + "#token=tok-0123456789abcdef")
    await wait_cell(page, "orders", "ready", "0")
    await page.wait_for("document.getElementById('server').textContent === 'ready'")
    sent = {(p, a, t) for p, a, t in seen if p.startswith("/v1/")}
    bearer = "Bearer tok-0123456789abcdef"
    assert ("/v1/queues", bearer, None) in sent
    assert ("/v1/status", bearer, None) in sent
    assert ("/v1/ws", None, "tok-0123456789abcdef") in sent
    assert all(a == bearer for p, a, _ in sent if p != "/v1/ws"), sent
    assert page.errors == []


ADMIN = Token(name="test", token="admin-0123456789abcdef", queues={"*": "admin"})
VIEWER = Token(name="dashboard", token="viewer-0123456789abcdef", queues={"*": "read"})


async def as_admin(api: Api, method: str, path: str, doc: Any) -> None:
    headers = {"Authorization": f"Bearer {ADMIN.token}"}
    async with api.client.request(method, path, json=doc, headers=headers) as resp:
        assert resp.status in (200, 201), await resp.text()


async def test_with_tokens_configured_the_page_works_only_with_a_token_in_the_fragment(
    start: Start, browser: Chromium, page: Page
) -> None:
    api = await start(AppOptions(tokens=[ADMIN, VIEWER]))
    await as_admin(api, "PUT", "/v1/queues/orders", {})
    await page.navigate(str(api.client.make_url("/")))  # the page itself is open
    problem = "document.getElementById('problem').textContent"
    await page.wait_for(f"{problem}.includes('401 Unauthorized')")
    assert "/#token=YOUR_TOKEN" in await page.evaluate(problem)
    assert await page.evaluate("document.getElementById('server').textContent") == "no access"
    assert await page.evaluate("document.querySelector('tr[data-queue]')") is None

    viewer = await Page.open(browser)
    try:
        await viewer.navigate(f"{api.client.make_url('/')}#token={VIEWER.token}")
        await wait_cell(viewer, "orders", "ready", "0")
        await viewer.wait_for("document.body.dataset.ws === 'open'")
        await as_admin(api, "POST", "/v1/queues/orders/messages", {"messages": [{"body": "x"}]})
        await wait_cell(viewer, "orders", "ready", "1", within=5)
        await viewer.wait_for("document.getElementById('server').textContent === 'ready'")
        assert await viewer.evaluate("document.getElementById('problem').hidden") is True
        assert viewer.errors == []
    finally:
        await viewer.close()


async def test_the_page_reconnects_and_rearms_its_watches_after_the_socket_closes(
    start: Start, page: Page
) -> None:
    api = await start()
    await api.create("orders")
    await page.navigate(str(api.client.make_url("/")))
    await wait_cell(page, "orders", "ready", "0")
    for conn in list(api.app[watches.WATCHERS].ws):
        conn.close(1012, "service restart")
    await page.wait_for("document.body.dataset.ws === 'closed'", within=5)
    await page.wait_for("document.body.dataset.ws === 'open'", within=5)
    await api.put("orders", "after")
    await wait_cell(page, "orders", "ready", "1", within=5)
    assert ws_keys(api) == [["queue:orders", "sys:queues", "sys:shards"]]
