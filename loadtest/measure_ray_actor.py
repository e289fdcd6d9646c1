"""Measure what one Ray actor process costs here (memory, threads), to size the shard pool.

.venv/bin/python loadtest/measure_ray_actor.py --actors 4
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil
import ray


@ray.remote
class Probe:
    async def pid(self) -> int:
        return os.getpid()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--actors", type=int, default=4)
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = [Probe.remote() for _ in range(args.actors)]
        pids = ray.get([a.pid.remote() for a in actors])
        time.sleep(5)  # let them settle
        rows = []
        for pid in pids:
            p = psutil.Process(pid)
            mem = p.memory_full_info()
            rows.append(
                {
                    "rss_mib": mem.rss / 2**20,
                    "uss_mib": mem.uss / 2**20,
                    "pss_mib": mem.pss / 2**20,
                    "threads": p.num_threads(),
                }
            )
        cpu = [psutil.Process(pid).cpu_percent(interval=2.0) for pid in pids]
        out = {
            "actors": len(rows),
            "rss_mib_each": round(sum(r["rss_mib"] for r in rows) / len(rows), 1),
            "uss_mib_each": round(sum(r["uss_mib"] for r in rows) / len(rows), 1),
            "pss_mib_each": round(sum(r["pss_mib"] for r in rows) / len(rows), 1),
            "threads_each": round(sum(r["threads"] for r in rows) / len(rows), 1),
            "idle_cpu_pct_each": round(sum(cpu) / len(cpu), 2),
            "ray": ray.__version__,
        }
        print(json.dumps(out))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
