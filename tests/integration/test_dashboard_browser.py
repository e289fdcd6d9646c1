"""The dashboard in headless Chromium against the real app (LocalDirectory, real HTTP on
127.0.0.1): the page lists the queues, follows their counts through the server's watches
over WebSocket, draws their charts, and shows the recovery report. The DOM is read over the
DevTools protocol (tests/integration/devtools.py).

``EVQ_DASHBOARD_SCREENSHOT=docs/dashboard.png`` keeps the first test's screenshot there
(how docs/dashboard.png is made).
"""

from __future__ import annotations

import asyncio
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


# ------------------------------------------------------------------ the console (issue 36)

ROWS = "[...document.querySelectorAll('#messages tbody tr')].map((r) => r.dataset.message)"
RENDERED = "document.body.dataset.rendered"


def keep_console_shot(png: bytes, name: str, tmp_path: Path) -> None:
    """Check a console page's PNG; keep it (also under $EVQ_CONSOLE_SCREENSHOTS/, where
    docs/console-*.png come from)."""
    image = Image.open(io.BytesIO(png))
    assert (image.width, image.height) >= (1000, 300), image.size
    if image.height > 1100:  # a page of 100 messages: its top shows what it is
        out = io.BytesIO()
        image.crop((0, 0, image.width, 1100)).save(out, "PNG", optimize=True)
        png = out.getvalue()
    (tmp_path / name).write_bytes(png)
    if where := os.environ.get("EVQ_CONSOLE_SCREENSHOTS"):
        (Path(where) / name).write_bytes(png)


async def go(page: Page, api: Api, fragment: str) -> None:
    """Open the console at ``#fragment`` and wait until that view is drawn."""
    await page.navigate(f"{api.client.make_url('/')}#{fragment}")
    await page.wait_for(f"{RENDERED} === {json.dumps('#' + fragment)}")


async def click(page: Page, selector: str) -> None:
    await page.evaluate(f"document.querySelector({json.dumps(selector)}).click()")


@pytest.mark.timeout(240)
async def test_the_console_pages_through_10000_messages_and_acts_on_one(
    start: Start, page: Page, tmp_path: Path
) -> None:
    api = await start()
    await api.create("orders")
    for n in range(10):
        await api.put("orders", *(f"order {n * 1000 + i}" for i in range(1000)))
    await go(page, api, "queue=orders")
    await page.wait_for(f"{ROWS}.length === 100")
    # the last hour's chart: the shard's samples and the counts now, drawn as its last bar
    history = await api.ok("GET", "/v1/queues/orders/history")
    chart = "document.getElementById('history-chart').dataset"
    assert int(await page.evaluate(f"{chart}.history")) >= 1
    assert history["samples"][-1]["ready"] == 10_000
    assert await page.evaluate(f"{chart}.max") == "10000"  # its scale: the counts now
    assert int(await page.evaluate(f"{chart}.areas")) >= 1
    rates = await page.evaluate("document.getElementById('history-rates').textContent")
    assert rates.startswith("· put "), rates
    seen_ids: list[str] = list(await page.evaluate(ROWS))
    for number in range(2, 6):  # four pages more, by the browse cursor
        await click(page, "#next-page")
        await page.wait_for(
            f"document.getElementById('page-number').textContent.startsWith('page {number} ')"
        )
        await page.wait_for(f"{ROWS}[0] !== {json.dumps(seen_ids[-100])}")
        seen_ids += await page.evaluate(ROWS)
    assert len(seen_ids) == len(set(seen_ids)) == 500  # each listed once, in take order
    first = await api.take("orders", 1)
    assert first[0]["id"] == seen_ids[0]
    keep_console_shot(await page.screenshot(), "console-queue.png", tmp_path)

    # a delayed message: its page shows the JSON body pretty-printed; run it now
    [later] = await api.put("orders", {"body": '{"invoice": 17, "to": "acme"}', "delay": 3600})
    await go(page, api, "queue=orders&state=delayed")
    await page.wait_for(f"{ROWS}.includes({json.dumps(later)})")
    await click(page, f'tr[data-message="{later}"] a')
    await page.wait_for(f"{RENDERED} === '#queue=orders&message={later}'")
    assert await page.evaluate("document.getElementById('body').dataset.kind") == "json"
    assert '"invoice": 17' in await page.evaluate("document.getElementById('body').textContent")
    state = "document.querySelector('[data-field=\"state\"]').textContent"
    assert await page.evaluate(state) == "delayed"
    keep_console_shot(await page.screenshot(), "console-message.png", tmp_path)
    await click(page, "#run-now")
    await page.wait_for(f"{state} === 'ready'")
    view = await api.ok("GET", f"/v1/queues/orders/messages/{later}")
    assert view["state"] == "ready"
    # its body edited from its page
    await page.evaluate("document.getElementById('new-body').value = '{\"invoice\": 18}'")
    await click(page, "#save-body")
    await page.wait_for("document.getElementById('body').textContent.includes('18')")
    view = await api.ok("GET", f"/v1/queues/orders/messages/{later}")
    assert view["body"] == '{"invoice": 18}'

    # settings edited live: a limit set, then lifted
    await go(page, api, "queue=orders")
    take_rate = "document.querySelector('input[data-setting=\"take_rate\"]')"
    await page.evaluate(f"{take_rate}.value = '50'")
    await click(page, "#save-settings")
    await page.wait_for("document.getElementById('save-settings').dataset.saved")
    assert (await api.ok("GET", "/v1/queues/orders"))["settings"]["take_rate"] == 50
    await page.evaluate(f"{take_rate}.value = ''")
    await click(page, "#save-settings")
    await page.wait_for(f"{take_rate}.dataset.was === ''")
    assert (await api.ok("GET", "/v1/queues/orders"))["settings"]["take_rate"] is None
    # and the queue made fair (a checkbox), then not
    fair = "document.querySelector('input[data-setting=\"fair\"]')"
    assert await page.evaluate(f"{fair}.type") == "checkbox"
    await page.evaluate(f"{fair}.checked = true")
    await click(page, "#save-settings")
    await page.wait_for(f"{fair}.dataset.was === 'true'")
    assert (await api.ok("GET", "/v1/queues/orders"))["settings"]["fair"] is True
    await page.evaluate(f"{fair}.checked = false")
    await click(page, "#save-settings")
    await page.wait_for(f"{fair}.dataset.was === 'false'")
    assert (await api.ok("GET", "/v1/queues/orders"))["settings"]["fair"] is False

    # a reserved message deleted by force from its page
    await go(page, api, f"queue=orders&message={first[0]['id']}")
    assert await page.evaluate(state) == "reserved"
    await page.evaluate("window.confirm = () => true")
    await click(page, "#delete")
    await page.wait_for(f"{RENDERED} === '#queue=orders&state=reserved'")
    assert await api.ack("orders", first[0]) == ["stale_lease"]

    # purge asks for the queue's name
    await go(page, api, "queue=orders")
    await page.evaluate("window.prompt = () => 'order'")  # not the name: nothing happens
    await click(page, "#purge")
    await page.wait_for(
        "document.getElementById('problem').textContent.includes('nothing was purged')"
    )
    assert (await api.stats("orders"))["total"] == 10_000
    await page.evaluate("window.prompt = () => 'orders'")
    await click(page, "#purge")
    await page.wait_for(
        "document.getElementById('redrive-progress').textContent === 'purged 10000'"
    )
    assert page.errors == []


@pytest.mark.timeout(240)
async def test_the_console_pauses_while_consumers_run_and_redrives_a_dead_letter_queue(
    start: Start, page: Page, tmp_path: Path
) -> None:
    api = await start()
    await api.create("work")
    await api.put("work", *(f"job {i}" for i in range(500)))
    taken: list[float] = []
    stop = asyncio.Event()

    async def consumer() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            got = await api.take("work", 5, wait=0.2)
            if got:
                taken.extend([loop.time()] * len(got))
                await api.ack("work", *got)
            await asyncio.sleep(0.05)

    consumers = [asyncio.ensure_future(consumer()) for _ in range(2)]
    try:
        await go(page, api, "queue=work")
        await page.wait_for("document.getElementById('paused-badge').textContent === 'taking'")
        await click(page, "#pause")
        await page.wait_for("document.getElementById('paused-badge').textContent === 'paused'")
        assert (await api.stats("work"))["paused"] is True
        await asyncio.sleep(0.5)  # what was in flight settles
        before = len(taken)
        await asyncio.sleep(1.5)
        assert len(taken) == before  # paused: the consumers get nothing
        await page.evaluate("location.hash = '#'")  # the list shows the pause too
        await wait_cell(page, "work", "paused", "paused")
        await go(page, api, "queue=work")
        await click(page, "#pause")  # now "Resume"
        await page.wait_for("document.getElementById('paused-badge').textContent === 'taking'")
        await asyncio.sleep(1.0)
        assert len(taken) > before  # resumed: they take again
    finally:
        stop.set()
        await asyncio.gather(*consumers)

    # a dead-letter queue of 1,000, redriven at 400 a second from its page
    await api.create("dead")
    await api.create("source", max_receives=1, dead_letter_queue="dead")
    await api.put("source", *(f"letter {i}" for i in range(1000)))
    letters = await api.take("source", 1000)
    await api.items("source", "release", *({"id": d["id"], "lease": d["lease"]} for d in letters))

    async def routed() -> bool:
        return (await api.stats("dead"))["ready"] == 1000

    await eventually_async(routed)
    # the source's page lists its dead letters (on "dead"), a page of 100 at a time
    await api.create("other", max_receives=1, dead_letter_queue="dead")
    await go(page, api, "queue=source&state=dead-lettered")
    await page.wait_for(f"{ROWS}.length === 100")
    first = await page.evaluate(ROWS)
    href = await page.evaluate(
        f"document.querySelector('tr[data-message=\"{first[0]}\"] a').getAttribute('href')"
    )
    assert href == f"#queue=dead&message={first[0]}"  # each opens on the dead-letter queue
    await click(page, "#next-page")
    await page.wait_for(f"{ROWS}.length === 100 && {ROWS}[0] !== {json.dumps(first[0])}")
    assert not set(await page.evaluate(ROWS)) & set(first)
    await go(page, api, "queue=other&state=dead-lettered")  # none of them are other's
    await page.wait_for("document.getElementById('page-number').textContent.includes(' 0 ')")
    assert await page.evaluate(f"{ROWS}.length") == 0
    await go(page, api, "queue=work&state=dead-lettered")  # no dead-letter queue: no such tab
    assert await page.evaluate("document.querySelector('.tabs a.on').dataset.state") == "ready"
    await go(page, api, "queue=dead")
    await page.wait_for(f"{ROWS}.length === 100")
    # three picked from the page go first
    picked = (await page.evaluate(ROWS))[:3]
    for mid in picked:
        await click(page, f'tr[data-message="{mid}"] input')
    await page.evaluate("document.getElementById('redrive-rate').value = '400'")
    await click(page, "#redrive-selected")
    progress = "document.getElementById('redrive-progress')"
    await page.wait_for(f"{progress}.textContent.endsWith('3/3 done')", within=20)
    for mid in picked:
        view = await api.ok("GET", f"/v1/queues/source/messages/{mid}")
        assert view["state"] == "ready"
    assert (await api.stats("dead"))["ready"] == 997
    # then the rest, all of them
    started = asyncio.get_running_loop().time()
    await click(page, "#redrive")
    await page.wait_for(f"{progress}.textContent.includes('/997 running')", within=10)
    await page.wait_for(f"!{progress}.textContent.includes(': 0/')", within=10)  # under way
    keep_console_shot(await page.screenshot(), "console-redrive.png", tmp_path)
    await page.wait_for(f"{progress}.dataset.state === 'done'", within=60)
    assert asyncio.get_running_loop().time() - started >= 1.5  # 997 at 400 a second
    assert "997/997 done" in await page.evaluate(f"{progress}.textContent")
    assert (await api.stats("source"))["ready"] == 1000
    assert (await api.stats("dead"))["total"] == 0
    assert page.errors == []


async def eventually_async(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        assert loop.time() < deadline, "not within the time"
        await asyncio.sleep(0.1)


async def test_the_console_shows_to_a_read_token_and_acts_only_for_an_admin(
    start: Start, browser: Chromium
) -> None:
    api = await start(AppOptions(tokens=[ADMIN, VIEWER]))
    await as_admin(api, "PUT", "/v1/queues/orders", {})
    await as_admin(api, "POST", "/v1/queues/orders/messages", {"messages": [{"body": "x"}]})
    badge = "document.getElementById('paused-badge').textContent"
    problem = "document.getElementById('problem').textContent"
    for token, allowed in ((VIEWER, False), (ADMIN, True)):
        tab = await Page.open(browser)
        try:
            await go(tab, api, f"token={token.token}&queue=orders")
            await tab.wait_for(f"{ROWS}.length === 1")  # a read token sees the messages
            await click(tab, "#pause")
            if allowed:
                await tab.wait_for(f"{badge} === 'paused'")
            else:
                await tab.wait_for(f"{problem}.includes('403 Forbidden')")
                assert await tab.evaluate(badge) == "taking"
            assert token.token not in await tab.evaluate("document.body.innerText")
        finally:
            await tab.close()
        headers = {"Authorization": f"Bearer {ADMIN.token}"}
        async with api.client.get("/v1/queues/orders", headers=headers) as resp:
            assert (await resp.json())["stats"]["paused"] is allowed


async def test_the_cluster_page_shows_the_shards_their_queues_and_the_gateways(
    start: Start, browser: Chromium, tmp_path: Path
) -> None:
    api = await start(AppOptions(tokens=[ADMIN, VIEWER]))
    for name in ("orders", "emails", "invoices"):
        await as_admin(api, "PUT", f"/v1/queues/{name}", {})
    headers = {"Authorization": f"Bearer {VIEWER.token}"}
    tab = await Page.open(browser)
    try:
        await go(tab, api, f"token={VIEWER.token}")  # the queue list: a read token
        href = await tab.evaluate("document.getElementById('cluster-link').getAttribute('href')")
        assert href == f"#token={VIEWER.token}&cluster=1"  # the token goes along
        await click(tab, "#cluster-link")
        await tab.wait_for(f"{RENDERED} === {json.dumps(href)}")
        async with api.client.get("/v1/admin/shards", headers=headers) as resp:
            shards = await resp.json()
        async with api.client.get("/v1/status", headers=headers) as resp:
            status = await resp.json()
        rows = await tab.evaluate(
            "[...document.querySelectorAll('#cluster-shards tbody tr')].map((r) => "
            "[+r.dataset.shard, r.dataset.state, r.querySelector('[data-field=queues]')"
            ".textContent, r.querySelector('td.name').textContent])"
        )
        assert [r[:3] for r in rows] == [
            [s["index"], s["state"], str(len(s["queues"]))] for s in shards["shards"]
        ]
        assert len(rows) == 2
        assert sum(int(r[2]) for r in rows) == 3
        for name in ("orders", "emails", "invoices"):
            assert name in rows[placement(name, 2)][3], (name, rows)
        [gateway] = status["gateways"]
        assert (gateway["self"], gateway["pid"]) == (True, os.getpid())
        cells = await tab.evaluate(
            "[...document.querySelectorAll('#cluster-gateways tbody tr')].map((r) => "
            "[r.dataset.gateway, r.className, r.textContent])"
        )
        assert [(c[0], c[1]) for c in cells] == [(gateway["id"], "self")]
        assert "(this one)" in cells[0][2]
        summary = await tab.evaluate("document.getElementById('cluster-summary').textContent")
        assert summary.startswith(f"2 shard(s) · map generation {shards['generation']} · 1 ")
        assert VIEWER.token not in await tab.evaluate("document.body.innerText")
        keep_console_shot(await tab.screenshot(), "console-cluster.png", tmp_path)
        # a queue's name opens its page
        shard = placement("orders", 2)
        await click(tab, f'tr[data-shard="{shard}"] td.name a[href$="queue=orders"]')
        await tab.wait_for(f"{RENDERED} === {json.dumps(f'#token={VIEWER.token}&queue=orders')}")
    finally:
        await tab.close()
