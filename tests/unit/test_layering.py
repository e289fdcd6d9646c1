"""The pure core imports nothing of Ray, aiohttp, asyncio or I/O — not even indirectly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules that must stay pure, as paths relative to the repository root (globs allowed).
PURE = [
    "actors/core/*.py",
    "actors/errors.py",
    "actors/settings.py",
    "actors/status.py",
    "actors/log/codec.py",
    "actors/log/keys.py",
    "actors/log/wal.py",
    "watch/*.py",  # watch/ holds only the pure bookkeeping; its transports are the gateway's
    "gateway/watches/codec.py",
]
BANNED = {
    "ray",
    "aiohttp",
    "asyncio",
    "os",
    "io",
    "pathlib",
    "socket",
    "subprocess",
    "threading",
    "multiprocessing",
    "shutil",
    "tempfile",
    "time",
    "datetime",
    "random",
    "select",
    "selectors",
    "signal",
    "logging",
    "urllib",
    "http",
    "obstore",
    "boto3",
    "uuid",
}


def _pure_files() -> list[Path]:
    files = sorted({p for pattern in PURE for p in ROOT.glob(pattern)})
    assert files, "no pure modules found: the layering test would check nothing"
    return files


def _imports(path: Path) -> set[str]:
    """Absolute module names imported by ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    try:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    except ValueError:
        package = ""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _own_file(module: str) -> Path | None:
    for candidate in (
        ROOT / (module.replace(".", "/") + ".py"),
        ROOT / module.replace(".", "/") / "__init__.py",
    ):
        if candidate.is_file():
            return candidate
    return None


def _closure(start: Path) -> dict[str, Path]:
    """Every module of ours ``start`` reaches, and every outside module name it imports."""
    seen: dict[str, Path] = {}
    todo = [start]
    outside: set[str] = set()
    while todo:
        path = todo.pop()
        for name in _imports(path):
            own = _own_file(name)
            if own is None:
                outside.add(name)
            elif str(own) not in seen:
                seen[str(own)] = own
                todo.append(own)
    seen.update({f"outside:{name}": Path(name) for name in outside})
    return seen


def _violations(path: Path, pure: set[str]) -> list[str]:
    """Banned outside modules and impure modules of ours that ``path`` reaches."""
    reached = _closure(path)
    outside = {key.split(":", 1)[1] for key in reached if key.startswith("outside:")}
    problems = sorted(n for n in outside if n.split(".")[0] in BANNED)
    problems += sorted(
        k
        for k in reached
        if not k.startswith("outside:") and k not in pure and not k.endswith("__init__.py")
    )
    return problems


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_io_ray_or_aiohttp(path: Path) -> None:
    assert _violations(path, {str(p) for p in _pure_files()}) == []


def test_the_layering_check_catches_direct_and_indirect_io(tmp_path: Path) -> None:
    """The checker itself works: os directly, asyncio directly, and a shell module of ours."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom asyncio import sleep\nfrom actors import ids\n")
    problems = _violations(bad, set())
    assert "os" in problems
    assert "asyncio" in problems
    assert str(ROOT / "actors" / "ids.py") in problems
