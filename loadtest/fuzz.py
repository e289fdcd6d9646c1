"""The fuzzing campaign: every decoder of ``loadtest/fuzz_targets.py`` under atheris
(libFuzzer, coverage-guided), with a 1 s limit per input and a memory limit per process.

One target::

    .venv/bin/python loadtest/fuzz.py --target channel --runs 200000 --out /tmp/fuzz

The whole campaign (each target in a process of its own, one after the other; the inputs
shared out between the targets; a report with each target's runs, speed and findings)::

    .venv/bin/python loadtest/fuzz.py --inputs 10000000 --out /tmp/fuzz

Each target starts from its seeds (``fuzz_targets.SEEDS``) and the regression corpus
(``tests/data/fuzz/<target>/``: every crash ever found, kept as a test). libFuzzer writes what
it finds to ``OUT/<target>/``: ``crash-*`` (an exception other than the decoder's documented
refusals), ``timeout-*`` (an input that took over ``--timeout`` seconds), ``oom-*`` (the
process over ``--rss-mb``). The campaign passes when there are none; a finding goes to
``tests/data/fuzz/<target>/`` once fixed, where ``tests/unit/test_fuzz.py`` replays it.
libFuzzer's own progress lines (runs, coverage, execs/s) go to ``OUT/<target>.log``; the
campaign prints one line per target as it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGRESSIONS = ROOT / "tests" / "data" / "fuzz"
FINDINGS = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")


def run_one(name: str, runs: int, out: Path, timeout_s: int, rss_mb: int, max_len: int) -> int:
    """Fuzz one target in this process (atheris takes it over; it exits when done)."""
    import atheris

    sys.path.insert(0, str(ROOT))
    with atheris.instrument_imports(include=["actors", "gateway", "evq", "loadtest"]):
        from loadtest import fuzz_targets
    target = fuzz_targets.TARGETS[name]
    expected = fuzz_targets.EXPECTED

    def one(data: bytes) -> None:
        with contextlib.suppress(expected):
            target(data)

    corpus = out / name / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(fuzz_targets.SEEDS.get(name, [])):
        (corpus / f"seed-{i}").write_bytes(seed)
    args = [
        sys.argv[0],
        f"-runs={runs}",
        f"-timeout={timeout_s}",
        f"-rss_limit_mb={rss_mb}",
        f"-max_len={max_len}",
        f"-artifact_prefix={out / name}/",
        "-print_final_stats=1",
        str(corpus),
    ]
    regressions = REGRESSIONS / name
    if regressions.is_dir():
        args.append(str(regressions))
    atheris.Setup(args, one)
    atheris.Fuzz()
    return 0


def _findings(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(FINDINGS))


def campaign(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from loadtest.fuzz_targets import TARGETS

    names = args.targets.split(",") if args.targets else list(TARGETS)
    share = max(1, args.inputs // len(names))
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, dict[str, object]] = {}
    began = time.monotonic()
    for name in names:
        log = args.out / f"{name}.log"
        start = time.monotonic()
        command = [
            sys.executable,
            __file__,
            "--target",
            name,
            "--runs",
            str(share),
            "--out",
            str(args.out),
            "--timeout",
            str(args.timeout),
            "--rss-mb",
            str(args.rss_mb),
        ]
        with log.open("wb") as sink:
            code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=False)
        text = log.read_text(errors="replace")
        done = re.findall(r"Done (\d+) runs", text)
        runs = int(done[-1]) if done else max([0, *map(int, re.findall(r"^#(\d+)", text, re.M))])
        found = _findings(args.out / name)
        if code.returncode != 0 and not found:  # a crash whose input libFuzzer did not write
            crash = "Uncaught Python exception" in text
            found = [f"{'crash' if crash else 'exit'} {code.returncode} (see {log})"]
        report[name] = {
            "runs": runs,
            "seconds": round(time.monotonic() - start, 1),
            "exit": code.returncode,
            "findings": found,
        }
        print(
            f"{name}: {runs:,} inputs in {report[name]['seconds']} s, exit {code.returncode}, "
            f"findings: {', '.join(found) or 'none'}",
            flush=True,
        )
    total = sum(int(r["runs"]) for r in report.values())  # type: ignore[call-overload]
    bad = {n: r["findings"] for n, r in report.items() if r["findings"] or r["exit"] != 0}
    summary = {
        "inputs": total,
        "seconds": round(time.monotonic() - began, 1),
        "targets": report,
        "timeout_s": args.timeout,
        "rss_limit_mb": args.rss_mb,
        "command": " ".join([sys.executable, *sys.argv]),
        "passed": not bad,
    }
    (args.out / "report.json").write_text(json.dumps(summary, indent=2))
    print(f"{total:,} inputs over {len(names)} targets; {bad if bad else 'no findings'}")
    return 0 if not bad else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="fuzz this target only, in this process")
    parser.add_argument("--targets", help="the campaign's targets, comma-separated (all)")
    parser.add_argument("--runs", type=int, default=100_000, help="inputs for --target")
    parser.add_argument("--inputs", type=int, default=10_000_000, help="the campaign's inputs")
    parser.add_argument("--out", type=Path, default=Path("/tmp/evq-fuzz"))
    parser.add_argument("--timeout", type=int, default=1, help="seconds per input at most")
    parser.add_argument("--rss-mb", type=int, default=2048, help="a target's memory at most")
    parser.add_argument("--max-len", type=int, default=65536, help="an input's bytes at most")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.target:
        return run_one(args.target, args.runs, args.out, args.timeout, args.rss_mb, args.max_len)
    return campaign(args)


if __name__ == "__main__":
    raise SystemExit(main())
