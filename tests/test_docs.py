"""The README is a front page, the CHANGELOG one line a change, and every file the docs cite exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 150
ENTRY_CHARS = 300
# the texts that cite scripts, examples and results
CITING = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
CITED = re.compile(r"(?<![\w./-])((?:benchmarks|scripts|examples|tests|docs|\.ci)/[\w./*-]*[\w*])")
BENCH = re.compile(r"(?<![\w./-])(bench_\w+\.py|compare_trees\.py)")


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, (
        f"README.md has {len(lines)} lines (at most {README_LINES}): move prose into docs/"
    )


def _entries() -> list[str]:
    """The CHANGELOG's entries: each list item (its continuation lines joined) and each table row."""
    entries: list[str] = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- ") or (stripped.startswith("|") and not set(stripped) <= set("|-: ")):
            entries.append(stripped)
        elif stripped and not stripped.startswith("#") and entries and line.startswith(" "):
            entries[-1] += " " + stripped  # a list item wrapped over lines is one entry
    return entries


def test_the_changelog_has_entries() -> None:
    assert len(_entries()) > 50  # a check that finds nothing to check cannot fail


@pytest.mark.parametrize("entry", _entries(), ids=lambda entry: entry[:40])
def test_no_changelog_entry_is_over_300_characters(entry: str) -> None:
    assert len(entry) <= ENTRY_CHARS, (
        f"{len(entry)} characters (at most {ENTRY_CHARS}); figures go to docs/performance.md"
    )


def _cited() -> list[tuple[str, str]]:
    found = set()
    for doc in CITING:
        text = doc.read_text()
        for path in CITED.findall(text):
            found.add((doc.relative_to(ROOT).as_posix(), path.rstrip(".")))
        for name in BENCH.findall(text):
            found.add((doc.relative_to(ROOT).as_posix(), f"benchmarks/{name}"))
    return sorted(found)


def test_the_docs_cite_files() -> None:
    cited = {path for _, path in _cited()}
    assert {"benchmarks/run", "examples/batch_stream.py", "scripts/gpu-check"} <= cited, cited


@pytest.mark.parametrize("doc, path", _cited(), ids=lambda value: value)
def test_every_cited_script_and_result_exists(doc: str, path: str) -> None:
    matches = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
    assert matches and all(match.exists() for match in matches), f"{doc} cites {path}, which is not in the tree"
