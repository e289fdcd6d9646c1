"""A handler for tests/integration/test_process_logs.py (imported by Ray workers: it must stay
importable from the repository root)."""

from __future__ import annotations

import logging

from evq.handlers import Job, handler

log = logging.getLogger("evq.test.handler")


@handler(queue="logged")
def log_it(message: Job) -> None:
    """Log the message's id from inside the worker; ack."""
    log.info("handled message %s", message.id)
