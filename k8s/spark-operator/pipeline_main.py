"""spark-submit's entry for the SparkApplication: ``evq pipeline <arguments>``.

The store defaults to ``EVQ_STORE`` (the evq-config ConfigMap), so the manifest does not
repeat it.
"""

import os
import sys

from evq.cli.main import main


def pipeline_argv(args: list[str], environ: dict[str, str]) -> list[str]:
    """``evq pipeline`` arguments: ``args``, plus ``--store $EVQ_STORE`` when not given."""
    argv = ["pipeline", *args]
    if "--store" not in args and environ.get("EVQ_STORE"):
        argv += ["--store", environ["EVQ_STORE"]]
    return argv


if __name__ == "__main__":
    raise SystemExit(main(pipeline_argv(sys.argv[1:], dict(os.environ))))
