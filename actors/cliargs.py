"""argparse types that the command lines of evq share: the server's (``evq serve``), the
clients' (``evq put``, ``evq take``, …) and the pipeline jobs' (``evq pipeline …``). Light:
argparse only, so ``evq --help`` stays fast."""

from __future__ import annotations

import argparse

__all__ = ["count_arg"]


def count_arg(text: str) -> int:
    """A whole number, at least 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {text!r}")
    return value
