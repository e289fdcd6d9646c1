"""Watch keys: which strings are keys, and their kinds. Pure: the engine checks the keys of
``SetKey`` and ``GetKey`` with it, the shards' key table (:mod:`actors.keyspace`) and the
gateway's watch transports (long-poll, WebSocket) check the keys they are given.

- ``queue:{name}``: a queue's counts, published by the shard that holds the queue;
- ``sys:…``: server events, published by each gateway process itself;
- anything else: an application's key, durable in a key partition's log.
"""

from __future__ import annotations

from actors.errors import BadRequest

__all__ = ["MAX_KEY_LEN", "QUEUE_PREFIX", "SYS_PREFIX", "validate_key"]

MAX_KEY_LEN = 256
QUEUE_PREFIX = "queue:"
SYS_PREFIX = "sys:"


def validate_key(key: object) -> str:
    """A watch key: 1-256 printable characters.

    Raises:
        BadRequest: not such a string.
    """
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LEN or not key.isprintable():
        raise BadRequest("keys are 1-256 printable characters", key=str(key)[:100])
    return key
