"""What the load tools' tests share: a session of processes to read."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def session() -> Iterator[tuple[int, int]]:
    """A process in a session of its own and a child of it, both started and waiting for
    their stdin: (the session's leader, the child)."""
    child = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
    code = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "sys.stdin.read(); child.wait()\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdin is not None
    assert leader.stdout is not None
    try:
        yield leader.pid, int(leader.stdout.readline())  # printed by the child, once up
    finally:
        leader.stdin.close()  # both read EOF
        leader.wait(10)
        leader.stdout.close()
