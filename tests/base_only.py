"""A throwaway virtualenv with evq's base install only (or the extras named): no Ray, no
PySpark, unless an extra brings them.

The distributions are the dependency tree of ``pyproject.toml``'s ``dependencies`` (plus the
extras'), read from the installed distributions' metadata (markers evaluated), and linked
into the new virtualenv's site-packages from this one: no download, a fraction of a second.
evq itself is the checkout (a ``.pth`` file), as an editable install would have it. Code run
there fails on any import of a package the install does not bring, as it would for a user.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "evq"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: Sequence[str] = ()) -> list[Requirement]:
    """The project's own requirements: the base dependencies and those of ``extras``
    (an extra naming ``evq[…]`` brings those extras in turn)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    found = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in map(Requirement, optional[extra]):
            if _canonical(req.name) == PROJECT:
                todo += sorted(req.extras)
            else:
                found.append(req)
    return found


def distributions(extras: Sequence[str] = ()) -> set[str]:
    """Every installed distribution the requirements reach (markers evaluated, no extras
    of theirs unless asked for).

    Raises:
        PackageNotFoundError: one is not installed at all.
    """
    todo = [(req, "") for req in requirements(extras)]
    seen: set[tuple[str, str]] = set()  # (distribution, extra of it; "" for its base)
    while todo:
        req, extra_of_parent = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra_of_parent}):
            continue
        name = _canonical(req.name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) not in seen:
                seen.add((name, extra))
                todo += [(Requirement(r), extra) for r in metadata.requires(name) or []]
    return {name for name, _ in seen}


def make_venv(path: Path, extras: Sequence[str] = ()) -> Path:
    """A virtualenv at ``path`` holding only the distributions of evq's base install (and
    ``extras``), linked from this one, and evq itself from the checkout; its python.

    Raises:
        PackageNotFoundError: one of them is not installed here.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = site / "site-packages"
    for name in sorted(distributions(extras)):
        dist = metadata.distribution(name)
        for top in sorted({Path(str(f)).parts[0] for f in dist.files or []} - {".."}):
            target = site / top
            if not target.exists():
                target.symlink_to(Path(str(dist.locate_file(top))).resolve())
    (site / "evq-checkout.pth").write_text(f"{ROOT}\n")
    return path / "bin" / "python"
