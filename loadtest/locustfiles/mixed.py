"""The mixed fleet: 1000 producers and 1000 consumers of the native API at once.

Start all 2000 (``-u 2000``; ``fixed_count`` splits them 1000/1000 whatever ``-u`` says up
to that, and across ``--processes``). The mix of sizes (1 B to 1 MiB), batch sizes, delays
and attributes is in :mod:`mix`; the behaviour in :mod:`native`. On two cores the fleet
needs several Locust processes::

    locust -f loadtest/locustfiles/mixed.py --headless -u 2000 -r 200 -t 60s \\
        --processes 4 --host http://127.0.0.1:8700

``make loadtest`` runs this against a fresh local server (loadtest/smoke.py).
"""

from __future__ import annotations

import native

PRODUCERS = 1000
CONSUMERS = 1000


class MixedProducer(native.ProducerBase):
    """One of the fleet's producers."""

    fixed_count = PRODUCERS


class MixedConsumer(native.ConsumerBase):
    """One of the fleet's consumers."""

    fixed_count = CONSUMERS
