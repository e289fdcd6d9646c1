"""The import graph of evq's packages: no loops, and layers that point one way.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: an import moved
into a function still ties the two modules together, it only hides the tie.

The layers, from the bottom: the pure engine and the log (``actors/``, with ``watch/``'s pure
bookkeeping beside it); the server's HTTP side (``gateway/``) and the Spark jobs
(``pipeline/``) on it; the clients (``evq.client``), the handler SDK above them
(``evq.handlers``), the public face (``evq``) and, on top of everything it dispatches to,
the command line (``evq.cli``). The load tools (``loadtest/``) sit on top of it all: they
may import anything of ours and nothing imports them. Its scripts import one another as
top-level modules (``from served import EvqServe``: the folder is on ``sys.path`` when one
runs), named here ``loadtest.served``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "gateway", "watch", "pipeline", "evq")
TOOLS = "loadtest"  # scripts, importing one another as top-level modules

# (importer, imported): no module within the first may import a module within the second.
FORBIDDEN = [
    *[("actors", up) for up in ("gateway", "pipeline", "evq")],
    *[("watch", other) for other in ("actors", "gateway", "pipeline", "evq")],
    *[("gateway", up) for up in ("pipeline", "evq")],
    *[("pipeline", other) for other in ("gateway", "evq")],
    *[
        (client, up)
        for client in ("evq.client", "evq.client_wire")
        for up in ("gateway", "pipeline", "evq.handlers", "evq.cli")
    ],
    *[("evq.handlers", up) for up in ("gateway", "pipeline", "evq.cli")],
    *[(low, TOOLS) for low in PACKAGES],
]
# Only the command line itself and `python -m evq` may import the command line.
CLI, CLI_USERS = "evq.cli", ("evq.cli", "evq.__main__")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _modules(root: Path) -> dict[str, Path]:
    """Module name → file, for every module of our packages under ``root``."""
    found: dict[str, Path] = {}
    for package in (*PACKAGES, TOOLS):
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[list[str]]:
    """For each name the statement imports, the modules it may mean, most specific first
    (in ``loadtest/``, a top-level name may be one of its own scripts: ``loadtest.<name>``)."""
    tool = _within(package, TOOLS)
    if isinstance(node, ast.Import):
        return [[f"{TOOLS}.{a.name}", a.name] if tool else [a.name] for a in node.names]
    if node.level:
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    found = []
    for alias in node.names:
        candidates = [f"{module}.{alias.name}", module]
        if tool and not node.level:
            candidates = [f"{TOOLS}.{c}" for c in candidates] + candidates
        found.append(candidates)
    return found


def _graph(root: Path) -> dict[str, set[str]]:
    """Module → the modules of ours it imports (a module's own parent packages left out:
    importing a submodule always runs them, that is no tie of the module's making)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for candidates in _targets(node, package):
                target = next((m for m in candidates if m in modules), None)
                if target is not None and target != name and not _within(name, target):
                    edges.add(target)
        graph[name] = edges
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    loops.append(sorted(group))
    return loops


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points the wrong way, as ``importer -> imported``."""
    wrong = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            banned = any(
                _within(importer, low) and _within(target, high) for low, high in FORBIDDEN
            )
            if _within(target, CLI) and not any(_within(importer, u) for u in CLI_USERS):
                banned = True
            if banned:
                wrong.append(f"{importer} -> {target}")
    return wrong


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _graph(ROOT)
    assert len(graph) > 100, "the graph holds too few modules: is ROOT right?"
    assert _loops(graph) == []


def test_layers_point_one_way() -> None:
    assert _upward(_graph(ROOT)) == []


def test_the_public_face_offers_the_clients_the_handler_sdk_and_the_errors() -> None:
    import evq
    from actors import errors

    assert {"Client", "AsyncClient", "handler", "Job", "Send", "run"} <= set(evq.__all__)
    assert set(errors.__all__) <= set(evq.__all__)
    import evq.handlers

    lazy = {*evq._CLIENTS, *evq.handlers.__all__}
    assert lazy <= set(evq.__all__) == set(dir(evq))
    assert set(evq.__all__) - lazy <= set(vars(evq))  # the errors and types are there
    assert not {"client", "client_wire", "handlers"} & set(evq.__all__)  # submodules are not
    for name in evq.__all__:
        assert getattr(evq, name) is not None, name
    with pytest.raises(AttributeError):
        evq.NoSuchName  # noqa: B018


def test_importing_part_of_evq_loads_nothing_else() -> None:
    """The face loads each name on first use: a handler's worker imports evq.handlers and
    must not pay for the HTTP client (aiohttp), nor a client script for the handler SDK; and
    no ``evq`` command, nor a program of the blocking Client, pays for aiohttp."""
    import subprocess
    import sys

    probe = (
        "import sys, {0}; "
        "print(sorted(m for m in ('aiohttp', 'evq.client', 'evq.handlers') if m in sys.modules))"
    )

    def loaded(module: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe.format(module)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        return done.stdout.strip()

    assert loaded("evq") == "[]"
    assert loaded("evq.handlers.cluster") == "['evq.handlers']"
    assert loaded("evq.client") == "['evq.client']"  # AsyncClient loads aiohttp when it connects
    assert loaded("evq.cli.main") == "['evq.client', 'evq.handlers']"  # no aiohttp for a command


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in (*PACKAGES, TOOLS):
        (root / package).mkdir(exist_ok=True)
    return root


@pytest.mark.parametrize("hidden", [False, True], ids=["top-level", "in-a-function"])
def test_the_checks_catch_a_loop_and_an_upward_import(tmp_path: Path, hidden: bool) -> None:
    """The checker itself works, also on an import hidden in a function."""
    back = "def f():\n    from actors import a\n" if hidden else "from actors import a\n"
    root = _tree(
        tmp_path,
        {
            "actors/__init__.py": "",
            "actors/a.py": "from gateway.b import thing\n",
            "gateway/__init__.py": "",
            "gateway/b.py": back,
            "evq/__init__.py": "from evq.client import C\n",
            "evq/client.py": "from . import cli\n",
            "evq/cli/__init__.py": "",
        },
    )
    graph = _graph(root)
    assert _loops(graph) == [["actors.a", "gateway.b"]]
    assert _upward(graph) == ["actors.a -> gateway.b", "evq.client -> evq.cli"]


@pytest.mark.parametrize("hidden", [False, True], ids=["top-level", "type-checking"])
def test_the_checks_see_the_load_tools_scripts_and_packages(tmp_path: Path, hidden: bool) -> None:
    """A loop between two load-tool modules (also through ``TYPE_CHECKING``, as
    ``swarm.client`` and ``swarm.watchers`` had), and a product module importing a tool."""
    back = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .client import S\n"
        if hidden
        else "from .client import S\n"
    )
    root = _tree(
        tmp_path,
        {
            "loadtest/served.py": "import actors.a\n",
            "loadtest/bench.py": "from served import EvqServe\nimport swarm\n",
            "loadtest/swarm/__init__.py": "",
            "loadtest/swarm/client.py": "from .watchers import W\n",
            "loadtest/swarm/watchers.py": back,
            "actors/__init__.py": "",
            "actors/a.py": "from loadtest import served\n",
        },
    )
    graph = _graph(root)
    assert graph["loadtest.bench"] == {"loadtest.served", "loadtest.swarm"}
    assert _loops(graph) == [
        ["actors.a", "loadtest.served"],
        ["loadtest.swarm.client", "loadtest.swarm.watchers"],
    ]
    assert _upward(graph) == ["actors.a -> loadtest.served"]


def test_a_shard_status_is_read_without_the_shard() -> None:
    """The gateway, the dashboard and /metrics read ``ShardStatus`` (actors/status.py) off the
    data channel: neither the status nor the channel loads the shard's module."""
    import subprocess
    import sys

    probe = (
        "import sys, actors.status, actors.channel; "
        "print(sorted(m for m in ('actors.shard', 'actors.log.shard_recovery') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"
