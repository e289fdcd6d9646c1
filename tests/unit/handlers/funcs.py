"""Handlers defined at module level, found again by import (``module:function``)."""

from __future__ import annotations

import asyncio

from evq.handlers import Job, Send, handler


@handler("mail", batch_size=10, num_cpus=0)
def send(message: Job) -> Send:
    """A decorated handler: cascades the body into ``report``."""
    return Send("report", message.body)


def plain(message: Job) -> None:
    """A plain function: needs a queue given from outside."""
    if message.body == b"boom":
        raise ValueError("boom")


@handler("slow", num_cpus=0)
async def wait_a_little(message: Job) -> None:
    """An async handler: its messages overlap inside one task."""
    await asyncio.sleep(0.2)


NOT_CALLABLE = 3
