"""Real disk faults for tests: the helpers of :mod:`loadtest.diskfaults` (a small tmpfs that
fills up, and ``faultfs``, a FUSE file system whose fsyncs and writes fail or sleep on
command; they live in ``loadtest/`` so that the chaos campaign uses them too), plus
:func:`require`: the tests fail on the reason a fault cannot be set up when they run in CI
(``CI`` set) and skip with it elsewhere.
"""

from __future__ import annotations

import os

import pytest

from loadtest.diskfaults import (
    FaultFs,
    faultfs,
    fill,
    mounted,
    tmpfs,
    why_not_fuse,
    why_not_tmpfs,
)

__all__ = [
    "FaultFs",
    "faultfs",
    "fill",
    "mounted",
    "require",
    "tmpfs",
    "why_not_fuse",
    "why_not_tmpfs",
]


def require(reason: str | None) -> None:
    """Fail in CI (the Makefile installs what is needed), skip elsewhere, when ``reason``."""
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"a real disk fault cannot be set up: {reason}")
    pytest.skip(reason)
