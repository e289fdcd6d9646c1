"""The documentation holds together in a fresh clone: the API contract lives in the repository
(docs/API.md, the same as the shared one beside the checkout while there is one), and every
relative link of every tracked Markdown file reaches a tracked file — and, into Markdown, a
heading that is there (GitHub's anchors)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_API = ROOT.parent / "shared" / "API.md"

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_INLINE = re.compile(r"\]\(\s*<?([^()\s<>]+)>?(?:\s+[\"'(][^\"')]*[\"')])?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.M)
_HTML = re.compile(r"\b(?:href|src)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


@cache
def tracked() -> frozenset[str]:
    """Paths git tracks (what a fresh clone has), relative to the root."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return frozenset(p for p in out.decode().split("\0") if p)


def _exists(relative: str) -> bool:
    if relative in tracked():
        return True
    return any(p.startswith(relative.rstrip("/") + "/") for p in tracked())  # a directory


def _prose(text: str) -> str:
    """``text`` without code blocks and code spans (their brackets are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target in Markdown ``text`` (inline, reference, HTML), code aside."""
    prose = _prose(text)
    return [m for pattern in (_INLINE, _REFERENCE, _HTML) for m in pattern.findall(prose)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text, lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@cache
def anchors(relative: str) -> frozenset[str]:
    """The anchors a tracked Markdown file offers (repeated headings get -1, -2 …)."""
    text = _FENCE.sub("", (ROOT / relative).read_text())
    found: set[str] = set(_HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def broken(markdown: str, text: str | None = None) -> list[str]:
    """The links of Markdown file ``markdown`` (its ``text``, default: as it is) that a
    fresh clone would not resolve."""
    source = ROOT / markdown
    problems = []
    for target in links(source.read_text() if text is None else text):
        if _SCHEME.match(target):
            continue
        path, _, anchor = unquote(target).partition("#")
        resolved = (source.parent / path).resolve() if path else source
        try:
            relative = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            problems.append(f"{target}: outside the repository")
            continue
        if not _exists(relative):
            problems.append(f"{target}: {relative} is not in the repository")
        elif anchor and relative.endswith(".md") and anchor.lower() not in anchors(relative):
            problems.append(f"{target}: no heading #{anchor} in {relative}")
    return problems


def markdown_files() -> list[str]:
    return sorted(p for p in tracked() if p.endswith(".md"))


def test_every_relative_link_of_the_markdown_resolves_in_a_fresh_clone() -> None:
    problems = {md: broken(md) for md in markdown_files()}
    assert {md: p for md, p in problems.items() if p} == {}


def test_the_link_check_sees_links_and_their_anchors() -> None:
    text = (
        "[a](docs/API.md) ![b](docs/dashboard.png 'title')\n[c]: gateway/WIRE.md\n"
        '<a href="k8s/README.md">k</a> `[not](a/link)`\n```\n[nor](this)\n```\n'
    )
    assert links(text) == [
        "docs/API.md",
        "docs/dashboard.png",
        "gateway/WIRE.md",
        "k8s/README.md",
    ]
    assert slug("Several gateways (issue 17)") == "several-gateways-issue-17"
    assert slug("`evq serve` options") == "evq-serve-options"
    assert "using-it" in anchors("README.md")
    fine = "[ok](API.md) [ok](../README.md#using-it) [web](https://x.y/z)"
    assert broken("docs/x.md", fine) == []
    assert broken("docs/x.md", "[a](../../shared/API.md) [b](nope.md) [c](API.md#nope)") == [
        "../../shared/API.md: outside the repository",
        "nope.md: docs/nope.md is not in the repository",
        "API.md#nope: no heading #nope in docs/API.md",
    ]


def test_the_api_contract_in_the_repository_is_the_shared_one() -> None:
    if not SHARED_API.exists():
        pytest.skip("no ../shared/API.md beside this checkout")
    assert (ROOT / "docs" / "API.md").read_text() == SHARED_API.read_text(), (
        "docs/API.md differs from ../shared/API.md: copy the contract over"
    )
