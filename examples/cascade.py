"""A cascade of queues: each message moves stage by stage, never lost and never doubled.

Moving a message is two calls: put it into the next queue, then ack it in this one. A crash
between the two must not lose it (so the put comes first) nor double it (so the put's
idempotency key is derived from the source message's id: when the message comes back after
its visibility timeout and is moved again, the next queue answers "duplicate").

    python examples/cascade.py --server http://127.0.0.1:8700 --messages 5 --crash-once
"""

from __future__ import annotations

import argparse
import os

from evq import DEFAULT_URL, Client, Message, QueueError

VISIBILITY_TIMEOUT = 2.0  # short, so that the simulated crash heals quickly


def move(client: Client, source: str, target: str, message: Message, crash: bool) -> None:
    """Put ``message`` into ``target``, then ack it in ``source`` (unless we "crash")."""
    body = message.body + f" >{target}".encode()
    # The key names the source message, so a retried move is a duplicate. It must stay in
    # the target's idempotency window (default 15 min) for as long as retries can happen.
    key = f"{source}:{message.id}"
    result = client.put(target, body, idempotency_key=key)[0]
    print(f"{source} -> {target}: message {message.id} as {result.id} ({result.status})")
    if crash:
        print(f"  ** crash before the ack: {source} hands {message.id} out again later")
        return
    client.ack(source, message)


def finish(client: Client, queue: str, message: Message, done: list[str]) -> None:
    """The last stage: use the message, then ack it."""
    print(f"done: {message.body_text!r} (id {message.id} in {queue})")
    done.append(message.body_text)
    client.ack(queue, message)


def step(client: Client, stages: list[str], crash: list[bool], done: list[str]) -> None:
    """One pass over every stage: move what is ready one stage on."""
    for i, queue in enumerate(stages):
        for message in client.take(queue, 10, wait=0.2):
            if i + 1 == len(stages):
                finish(client, queue, message, done)
            else:
                move(client, queue, stages[i + 1], message, crash.pop() if crash else False)


def pending(client: Client, stages: list[str]) -> int:
    """Messages still in any stage (ready, delayed or reserved)."""
    stats = [client.get_queue(q).stats for q in stages]
    return sum(s.total for s in stats if s is not None)


def main() -> None:
    """Create the stages, seed the first one, and run the cascade until it is empty."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.environ.get("EVQ_SERVER", DEFAULT_URL))
    p.add_argument("--stages", default="ingest,resize,publish", help="comma-separated queues")
    p.add_argument("--messages", type=int, default=3, help="messages to seed")
    p.add_argument("--crash-once", action="store_true", help="skip one ack, as a crash would")
    args = p.parse_args()
    stages = args.stages.split(",")
    with Client(args.server) as client:
        try:
            for queue in stages:
                client.create_queue(queue, visibility_timeout=VISIBILITY_TIMEOUT)
            client.put(stages[0], [f"item-{n}" for n in range(args.messages)])
            crash = [True] if args.crash_once else []
            done: list[str] = []
            while True:
                step(client, stages, crash, done)
                if pending(client, stages) == 0:
                    break
        except QueueError as e:
            raise SystemExit(f"cascade: {e.code}: {e.message}") from None
    print(f"{args.messages} seeded, {len(done)} finished, {len(set(done))} distinct")


if __name__ == "__main__":
    main()
