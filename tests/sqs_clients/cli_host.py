"""Runs AWS CLI commands for the tests without a new process each: the real CLI's driver
(``awscli.clidriver``), one command per line of stdin (a JSON list of arguments), answered
with one line of JSON ``{"rc", "out", "err"}`` on stdout. Started with the Python of the
CLI's own virtualenv (``.venv`` or ``.venv-sqs-legacy``) and the environment the CLI would
have: what each command does and prints is what ``aws …`` does and prints; the process
start and the imports (~0.8 s of CPU a command) are paid once.
"""

from __future__ import annotations

import io
import json
import sys


def _one(argv: list[str]) -> dict[str, object]:
    from awscli.clidriver import create_clidriver

    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
        rc = create_clidriver().main(argv)
    except SystemExit as exc:  # argparse's errors, as `aws` exits with them
        rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        stdout.flush()
        stderr.flush()
        sys.stdout, sys.stderr = saved
    return {"rc": rc, "out": out.getvalue().decode(), "err": err.getvalue().decode()}


def main() -> None:
    answers = sys.stdout
    for line in sys.stdin:
        answers.write(json.dumps(_one(json.loads(line))) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
