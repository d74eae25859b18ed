"""Issue 31's size targets, held: no module over 500 lines of code, no function over 60.

Lines of code are the lines a token of code stands on: blank lines, comments and docstrings are
not counted. A module or function that grows past its limit is split by concept, not squeezed.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiocubie"
MODULE_LIMIT, FUNCTION_LIMIT = 500, 60


def code_lines(source: str) -> tuple[ast.Module, set[int]]:
    """The module's tree, and the numbers of its lines that hold code (not docstrings or comments)."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return tree, lines


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    tree, lines = code_lines(path.read_text())
    assert len(lines) <= MODULE_LIMIT, f"{path.name}: {len(lines)} lines of code (at most {MODULE_LIMIT})"
    long = {
        f"{node.name} (line {node.lineno})": size
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (size := sum(node.lineno <= n <= (node.end_lineno or node.lineno) for n in lines)) > FUNCTION_LIMIT
    }
    assert not long, f"{path.name}: functions over {FUNCTION_LIMIT} lines of code: {long}"


def test_the_count_ignores_docstrings_comments_and_blank_lines() -> None:
    source = 'def f():\n    """Doc.\n\n    More."""\n    # a comment\n\n    return (1 +\n            2)\n'
    _, lines = code_lines(source)
    assert lines == {1, 7, 8}
