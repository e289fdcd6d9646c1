"""The gateway alone: the real app over a directory that answers at once (no queues, no Ray,
no log). Driven like evq and like loadtest/trivial_server.py, it shows what the gateway's
own request handling costs compared with a trivial aiohttp endpoint.

    .venv/bin/python loadtest/gateway_only.py PORT
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.settings import QueueSettings
from actors.status import ShardStatus
from gateway import door
from gateway.app import make_app


class InstantDirectory:
    """Answers every command at once with a reply of the right type."""

    count = 1

    async def execute_many(self, queue: str, commands: list[object]) -> list[Any]:
        out: list[Any] = []
        for c in commands:
            if isinstance(c, cmd.Put):
                out.append([rp.PutResult(str(i), "created") for i, _ in enumerate(c.messages)])
            elif isinstance(c, cmd.Ack):
                out.append([rp.ItemResult(i.id, "ok") for i in c.items])
            else:
                out.append([])
        return out

    async def take(self, queue: str, command: cmd.Take, wait_s: float) -> Any:
        return []

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        return True, settings

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        await asyncio.Event().wait()  # nothing ever changes here
        raise AssertionError("unreachable")

    async def metrics(self) -> list[Any]:
        return []

    async def delete(self, name: str) -> None:
        return None

    async def names(self) -> list[str]:
        return []

    async def status(self, brief: bool = False) -> list[ShardStatus]:
        return [ShardStatus(0, True, 0, 0, [], {})]

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("port", type=int)
    args = ap.parse_args()
    door.run(make_app(InstantDirectory()), host="127.0.0.1", port=args.port)  # as evq serve


if __name__ == "__main__":
    main()
