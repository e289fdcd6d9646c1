"""The console's first paint with many queues (issue 36): ``evq serve`` with ``--queues``
queues (each holding a message), the console opened in headless Chromium (Debian's
``chromium``), timed from navigation to the browser's first contentful paint, to every
queue's row on the page, and to every row showing its counts (each from its own watch over
the one WebSocket). ``--runs`` page loads, each in a fresh tab; the median is reported.

    .venv/bin/python loadtest/console_paint.py --queues 1000 --runs 3

prints a line of progress per load on stderr and the figures as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from served import ROOT, EvqServe

sys.path.insert(0, str(ROOT))

from evq.client import Client
from tests.integration.devtools import Chromium, Page

ROWS = "document.querySelectorAll('#queues tbody tr').length"
COUNTED = (
    "[...document.querySelectorAll('#queues tbody td[data-field=\"ready\"]')]"
    ".filter((c) => c.textContent !== '…').length"
)
FCP = (
    "(performance.getEntriesByType('paint').find((e) => e.name === 'first-contentful-paint')"
    " || {}).startTime"
)


async def load(browser: Chromium, url: str, queues: int) -> dict[str, float]:
    page = await Page.open(browser)
    try:
        started = time.monotonic()
        await page.navigate(url)
        await page.wait_for(f"{ROWS} >= {queues}", within=120)
        rows = time.monotonic() - started
        await page.wait_for(f"{COUNTED} >= {queues}", within=120)
        counted = time.monotonic() - started
        fcp = await page.wait_for(FCP, within=30)
        return {
            "first_paint_ms": round(fcp, 1),
            "all_rows_ms": round(rows * 1000, 1),
            "all_counts_ms": round(counted * 1000, 1),
        }
    finally:
        await page.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log")
        browser = None
        try:
            server.wait_ready(120)
            with Client(server.url, retries=3, timeout=60) as c:
                for i in range(args.queues):
                    name = f"console-{i:05d}"
                    c.create_queue(name)
                    c.put(name, [b"m"])
            browser = Chromium(Path(tmp) / "profile")
            runs = []
            for n in range(args.runs):
                run = asyncio.run(load(browser, f"{server.url}/", args.queues))
                print(f"load {n + 1}: {run}", file=sys.stderr, flush=True)
                runs.append(run)
        finally:
            if browser is not None:
                browser.stop()
            server.stop()
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(json.dumps({"queues": args.queues, "runs": runs, "median": median}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
