"""Periodic work without cron: each job is one message, rescheduled instead of acked.

A consumer takes a due job, does its work, then reschedules it "again in N seconds" (a new
activation time on the same message). That ends the lease and resets the receive count, so
the job never leaves the queue. If the consumer dies mid-work, the lease expires and another
consumer runs the job; if the work fails, the job is released to be tried again soon.

    python examples/periodic.py --server http://127.0.0.1:8700 --every 5 --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from datetime import datetime

from evq import DEFAULT_URL, AsyncClient, Message, QueueError, StaleLease

RETRY_AFTER_FAILURE = 2.0  # seconds before a failed run is tried again


def clock(unix: float) -> str:
    """Server time as local HH:MM:SS."""
    return datetime.fromtimestamp(unix).strftime("%H:%M:%S")


async def seed(client: AsyncClient, queue: str, jobs: list[str]) -> None:
    """Create the queue and one message per job, once (ids are the job names)."""
    # A client-id queue: putting a job that is already there reports "duplicate", so
    # starting this example twice never doubles a job.
    await client.create_queue(queue, id_mode="client", visibility_timeout=30)
    for name in jobs:
        body = json.dumps({"job": name})
        result = (await client.put(queue, body, id=name))[0]
        print(f"job {name}: {result.status}")


async def do_work(job: str, message: Message) -> str:
    """The periodic task itself (here: pretend to work for a moment)."""
    await asyncio.sleep(0.1)
    return f"{job} done (was due at {clock(message.activate_at)})"


async def run_one(client: AsyncClient, queue: str, message: Message, every: float) -> bool:
    """Run one due job and reschedule it; True when it ran."""
    job = json.loads(message.body)["job"]
    try:
        outcome = await do_work(job, message)
    except Exception as e:  # the job failed: give it back, to be tried again soon
        print(f"{job} failed: {e}; again in {RETRY_AFTER_FAILURE:g}s")
        await client.release(queue, message, delay=RETRY_AFTER_FAILURE)
        return False
    try:
        view = await client.reschedule(queue, message, delay=every)
    except StaleLease:
        # The work outlived the visibility timeout: the job was handed to someone else.
        # Long work should call client.touch(queue, message) now and then.
        print(f"{job}: lease lost during the work; another consumer owns it now")
        return False
    print(f"{outcome}; next run at {clock(view.activate_at)}")
    return True


async def consume(client: AsyncClient, queue: str, every: float, rounds: int | None) -> None:
    """Take due jobs (long-polling), run each and reschedule it, ``rounds`` times or forever."""
    ran = 0
    while rounds is None or ran < rounds:
        for message in await client.take(queue, 10, wait=20):
            ran += await run_one(client, queue, message, every)


async def main() -> None:
    """Seed the jobs, then consume them."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.environ.get("EVQ_SERVER", DEFAULT_URL))
    p.add_argument("--queue", default="periodic")
    p.add_argument("--jobs", default="cleanup,report", help="comma-separated job names")
    p.add_argument("--every", type=float, default=5.0, help="seconds between runs of a job")
    p.add_argument("--rounds", type=int, default=None, help="stop after at least this many runs")
    args = p.parse_args()
    async with AsyncClient(args.server) as client:
        try:
            await seed(client, args.queue, args.jobs.split(","))
            await consume(client, args.queue, args.every, args.rounds)
        except QueueError as e:
            raise SystemExit(f"periodic: {e.code}: {e.message}") from None


if __name__ == "__main__":
    asyncio.run(main())
