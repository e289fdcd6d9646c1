"""The tests' free ports: a node's several ports are drawn before any is bound, so no two
draws in a row may coincide (Ray refuses a node whose components share a port)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.conftest import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))
import served


def test_any_sixty_four_draws_in_a_row_are_distinct_and_bindable() -> None:
    for draw in (free_port, served.free_port):
        ports = [draw() for _ in range(2000)]  # ~10 coincidences if drawn independently
        assert all(len(set(ports[i : i + 64])) == 64 for i in range(len(ports) - 63))
        assert all(20000 <= p <= 32767 for p in ports)
        with socket.socket() as s:
            s.bind(("127.0.0.1", ports[-1]))  # free when drawn, and still free
