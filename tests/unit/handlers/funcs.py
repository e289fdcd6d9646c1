"""Handlers defined at module level, found again by import (``module:function``)."""

from __future__ import annotations

import asyncio

from actors.handlers import Message, Put, handler


@handler("mail", batch_size=10, num_cpus=0)
def send(message: Message) -> Put:
    """A decorated handler: cascades the body into ``report``."""
    return Put("report", message.body)


def plain(message: Message) -> None:
    """A plain function: needs a queue given from outside."""
    if message.body == b"boom":
        raise ValueError("boom")


@handler("slow", num_cpus=0)
async def wait_a_little(message: Message) -> None:
    """An async handler: its messages overlap inside one task."""
    await asyncio.sleep(0.2)


NOT_CALLABLE = 3
