"""The baseline for server benchmarks: a trivial aiohttp app on the native API's paths.

It reads each request body and answers at once with a fixed reply of the right shape; no
queue, no durability. Driven by the same load generator as evq, it shows what the Python
HTTP stack alone costs on this machine, so evq's figures can be read as a ratio.

    .venv/bin/python loadtest/trivial_server.py PORT [--uvloop]
"""

from __future__ import annotations

import argparse

from aiohttp import web

PUT_REPLY = b'{"results":[{"id":"1","status":"created"}]}'
TAKE_REPLY = b'{"messages":[]}'
ACK_REPLY = b'{"results":[]}'


async def put(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=PUT_REPLY, content_type="application/json")


async def take(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=TAKE_REPLY, content_type="application/json")


async def ack(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ACK_REPLY, content_type="application/json")


async def queue(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=201 if request.method == "PUT" else 204)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/queues/{name}/messages", put)
    app.router.add_post("/v1/queues/{name}/take", take)
    app.router.add_post("/v1/queues/{name}/ack", ack)
    app.router.add_put("/v1/queues/{name}", queue)
    app.router.add_delete("/v1/queues/{name}", queue)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("port", type=int)
    ap.add_argument("--uvloop", action="store_true")
    args = ap.parse_args()
    loop_factory = None
    if args.uvloop:
        import uvloop

        loop_factory = uvloop.new_event_loop
    web.run_app(
        make_app(),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=loop_factory() if loop_factory else None,
    )


if __name__ == "__main__":
    main()
