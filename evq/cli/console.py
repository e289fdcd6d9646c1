"""The ``evq`` console script: :func:`evq.cli.main.main`, and one clear line instead of a
traceback when a command needs an extra that is not installed.

The base install (``pip install evq``) is the Python client and the command line's client
commands; ``evq serve``, ``reshard``, ``shards`` and ``handle`` need the ``server`` extra
(Ray, the log's codecs and stores), ``evq pipeline`` the ``pipeline`` extra (PySpark).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["EXTRA_OF_COMMAND", "main"]

# The extra each command needs beyond the base install, and the packages those extras bring.
EXTRA_OF_COMMAND = {
    "serve": "server",
    "reshard": "server",
    "shards": "server",
    "handle": "server",
    "pipeline": "pipeline",
}
_EXTRA_PACKAGES = {
    "server": {
        *("ray", "zstandard", "obstore", "prometheus_client", "httptools"),
        *("numpy", "uvloop", "cryptography"),
    },
    "pipeline": {"pyspark", "pyarrow", "pandas", "matplotlib", "zstandard", "obstore", "numpy"},
}


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand in ``argv`` (the first word that is no option or option value)."""
    words = iter(argv)
    for word in words:
        if word in ("--server", "--token"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``evq`` command line; exit 2 with the extra to install when a package the
    command needs is missing."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from evq.cli.main import main as cli_main

        return cli_main(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        command = _command(args)
        extra = EXTRA_OF_COMMAND.get(command or "")
        if extra is None or missing not in _EXTRA_PACKAGES[extra]:
            raise
        print(
            f"evq {command}: needs the Python package {missing!r}, which is not installed: "
            f"install evq with the {extra} extra (pip install 'evq[{extra}]')",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
