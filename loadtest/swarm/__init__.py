"""``loadtest/watch_swarm.py``, the tool: a swarm of one-shot watchers against ``evq serve``
(its docstring is the tool's documentation and ``--help``).

The client processes and what runs in them:

- ``watchers``: one watcher connection each (WebSocket or long poll) on a raw socket;
- ``client``: a client process's watchers (``Swarm``) and the loop answering the
  coordinator.

The coordinator (the process the tool starts in):

- ``coordinator``: starts the client processes and calls them over pipes;
- ``harness``: what the phases measure with (counters, the server's CPU, PUTs, bursts);
- ``phases``: one run's phases in order, and the coordinator's event loop around them;
- ``server``: ``evq serve`` started by the tool, and its processes found;
- ``http_client``, ``stats``, ``report``: the coordinator's HTTP, percentiles, the table;
- ``memprof`` (coordinator side) and ``memprof_server`` (the profiled process):
  ``--profile-memory``;
- ``cli``: the options and ``main``; ``common``: the clock, the log line, units and the
  counters' layout.

A process's CPU time, RSS and descriptors are read through ``loadtest/procstat.py``, as
``loadtest/cpu_per_put.py`` reads them. Imported as ``swarm`` (``python
loadtest/watch_swarm.py`` puts ``loadtest/`` first on ``sys.path``).
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
