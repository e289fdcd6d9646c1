"""The gateway's logging: :mod:`actors.logsetup`, which every evq process shares (text,
key=value or JSON; a slow sink drops and counts records, or blocks)."""

from __future__ import annotations

from actors.logsetup import (
    JsonFormatter,
    KeyValueFormatter,
    NonBlockingHandler,
    dropped,
    forward_ray_output,
    setup_logging,
)

__all__ = [
    "JsonFormatter",
    "KeyValueFormatter",
    "NonBlockingHandler",
    "dropped",
    "forward_ray_output",
    "setup_logging",
]
