"""What every part of the swarm shares: the clock, the progress log line, the machine's
description, units, the WebSocket GUID and the layout of the shared progress counters."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import procstat

__all__ = [
    "C_ARMED",
    "C_CONNECTED",
    "C_ERRORS",
    "C_EVENTS",
    "C_FAILED",
    "C_LOST",
    "KIB",
    "MIB",
    "N_COUNTERS",
    "WS_GUID",
    "log",
    "machine",
    "now",
]

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KIB = 1024
MIB = 1024 * 1024

# Shared per-process counters (progress), refreshed by each client process twice a second
C_CONNECTED, C_ARMED, C_FAILED, C_LOST, C_EVENTS, C_ERRORS = range(6)
N_COUNTERS = 6


def now() -> float:
    """The system-wide monotonic clock (comparable across processes on Linux)."""
    return time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "mem_total_gib": round(procstat.memory_bytes()["total"] / 1024**3, 1),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
