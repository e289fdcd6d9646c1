"""A swarm of one-shot watchers against ``evq serve`` (issue 5).

Opens N watchers (WebSocket ``/v1/ws`` by default, or long polls ``GET /v1/watch/{key}``) on
one or more keys, spread over P client processes and several 127.0.0.x source addresses (so
neither the 20k descriptors of a process nor the ~28k ephemeral ports of an address run out),
arms them, changes the keys and measures:

- **connect rate**: watchers connected per second (handshake done), and the time until all
  are armed (WebSocket: a ``ping`` sent after the ``watch`` came back as ``pong``, so the
  server has armed the key; long poll: the watch request is written, then ``--settle`` s);
- **server memory per watcher**: the RSS of every server process (the evq main process and
  its gateway workers, ``python -m gateway.workers``) summed before connecting and after all
  watchers are armed, the difference divided by the watchers armed;
- **idle cost**: server CPU while the watchers are connected and nothing changes;
- **a key nobody watches**: bursts of changes on unwatched keys with no watcher connected
  and again with all connected (PUT rate, server CPU meanwhile; medians of
  ``--unwatched-repeats``);
- **latency of one change** (``--singles`` times, each once the server is idle again):
  p50/p99/max over all watchers of the time from the PUT (sent, and answered) to the
  watcher's arrival, taken twice: the kernel's receive timestamp of the event at the
  watcher's socket (``SO_TIMESTAMPNS``: what the server achieved, whatever the client's
  scheduling) and the moment the client process handled it;
- **a burst** of ``--burst`` changes per key (PUTs as fast as the server takes them,
  ``--put-concurrency`` at once): PUT rate and latency, the time from the last PUT answered
  until every watcher holds the final version, how many events the watchers got
  (coalescing);
- **correctness**: every watcher must end with the key's final version (as ``GET
  /v1/keys/{key}`` tells); the count of those that did not, of lost connections and errors.

Every watcher follows the one-shot protocol: after each event it arms the key again with the
version it got. The client is lean (non-blocking sockets driven by the event loop's
``add_reader``, a minimal WebSocket client of its own: no transport, protocol or task per
connection, one ``send`` per re-arm); its CPU is reported next to the server's, the kernel
timestamps show when the server delivered independently of the client, and
``--client-nice 19`` is a control for how much the client on the same cores slows the
server. Times are taken with the system-wide clocks, so they compare across processes.

``--profile-memory`` instead holds ``-n`` watchers on one server process of each kind (a raw
asyncio WebSocket server, a bare aiohttp one, evq's gateway app) and breaks the memory per
connection down by object type and by allocation site (tracemalloc).

Against a running server (its main process and workers are found by the listening port,
or name the main process with ``--server-pid``)::

    .venv/bin/python loadtest/watch_swarm.py --url http://127.0.0.1:8700 -n 10000

Or let the tool start ``evq serve`` itself on a fresh temporary data directory, and stop it
at the end (SIGTERM; the exit code must be 0)::

    .venv/bin/python loadtest/watch_swarm.py --serve --workers 7 -n 100000 --burst 1000
    .venv/bin/python loadtest/watch_swarm.py --profile-memory -n 10000

The human-readable table goes to stdout, followed by the JSON summary (also written to
``--json-out``); progress goes to stderr. Every phase is bounded in time and the whole run by
``--max-seconds``. Exit status: 0 when every watcher ended at the final version (and a server
started here stopped with 0), 1 otherwise, 2 on bad arguments.
"""

# The tool lives in the package loadtest/swarm/ (imported as ``swarm``: running this script
# puts loadtest/ first on sys.path); its __init__ lists the modules. This file is the entry
# and its docstring is the tool's --help.

from __future__ import annotations

import swarm


def main(argv: list[str] | None = None) -> int:
    """Run the tool on ``argv`` (default: the command line); the exit status."""
    return swarm.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
