"""The `evq` command line."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `evq` console script."""
    print("evq: not implemented yet", file=sys.stderr)
    return 2
