"""A local Ray runtime in the test process, for the tests that drive actors directly.

``ray.shutdown()`` at the end stops only this runtime (never ``ray stop``, which kills
every Ray process of the user). The environment Ray needs here is set for the runtime's
life and restored after.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.integration.server import RAY_ENV


@contextmanager
def local_ray(num_cpus: int, namespace: str) -> Iterator[Any]:
    """``ray.init`` with ``num_cpus`` in ``namespace`` (as ``evq serve`` starts its own: no
    autoscaler monitor, no dashboard API server); yields the ``ray`` module."""
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    import ray

    from actors.localray import init_local

    try:
        init_local(
            num_cpus=num_cpus,
            include_dashboard=False,
            namespace=namespace,
            log_to_driver=False,
            runtime_env={"env_vars": RAY_ENV},
        )
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
