"""Free TCP ports on 127.0.0.1 for the servers the tools and the tests start (one copy for
both: the tools import it as ``ports``, the tests as ``loadtest.ports``)."""

from __future__ import annotations

import collections
import random
import socket

_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=64)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now, drawn from 20000-32767: below the kernel's
    ephemeral range (where a port bound to 0 by anyone, Ray's servers in the very process
    being started among them, and every outgoing connection's own end land) and above
    Ray's worker ports (10002-19999), so it is not taken between this check and the bind
    of the server it is for, as a port the kernel handed out could be. Never one of the last
    64 it handed out: a node's several ports, drawn before any is bound, stay distinct."""
    for _ in range(200):
        port = random.randint(20000, 32767)
        if port in _RECENT_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _RECENT_PORTS.append(port)
            return port
    raise RuntimeError("no free port on 127.0.0.1 in 20000-32767")
