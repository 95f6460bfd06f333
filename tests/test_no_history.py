"""Library code states rules and their reasons, not the history of how they were found.

Measurements belong in docs/results/*.json and docs/BENCHMARKS.md (which the code
may cite by name); the code's comments and docstrings name no work session and no
measuring machine.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "mucudnn").rglob("*.py"))


def _prose(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of ``path``."""
    text = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def test_sources_are_found():
    assert len(SOURCES) > 40


@pytest.mark.slow
def test_no_session_in_comments_or_docstrings():
    hits = [f"{p.relative_to(ROOT)}:{line}" for p in SOURCES for line, s in _prose(p)
            if "session" in s.lower()]
    assert not hits, hits


def test_no_measuring_machine_named_in_the_library():
    hits = [str(p.relative_to(ROOT)) for p in SOURCES
            if "h200" in p.read_text(encoding="utf-8").lower()]
    assert not hits, hits
