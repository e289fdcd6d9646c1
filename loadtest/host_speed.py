"""How fast this host's cores are right now: 5 million multiply-adds in a Python loop, three
times, the seconds each took. The machines are VMs whose neighbours slow a core without the
guest seeing it as steal (the same test suite took 10 min 52 s and 15 min 9 s of tests on
one evening, the steal under 3 % in both): quote this beside a figure that depends on it.

    python3 loadtest/host_speed.py        # e.g. "python loop 5M: 0.250 0.250 0.251 s"
"""

from __future__ import annotations

import time


def loop_s(n: int = 5_000_000) -> float:
    """Seconds for ``n`` multiply-adds in a plain loop."""
    started, total = time.perf_counter(), 0
    for i in range(n):
        total += i * i
    return time.perf_counter() - started


if __name__ == "__main__":
    print("python loop 5M:", " ".join(f"{loop_s():.3f}" for _ in range(3)), "s")
