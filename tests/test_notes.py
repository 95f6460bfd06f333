"""Notes follow PyTorch's convention: each is defined once, every mention names one.

A definition is a line holding only ``Note [title]`` (after a comment's ``#`` or a
docstring's quotes) followed by a line of ``~``; it lives in ``mucudnn/`` or
``tools/``. Every other mention of a Note, in code, tests or ``docs/*.md``, is a
reference ("See Note [title]", or the Note named in parentheses inside prose) and
must name a defined title. Titles may wrap across comment lines.
"""

from __future__ import annotations

import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MENTION = re.compile(r"Note\s+\[([^\]]+)\]")
TITLE_LINE = re.compile(r'^(?:#:?|r?"""|\'\'\')?\s*Note \[([^\]]+)\]\s*$')
UNDERLINE = re.compile(r"^#?\s*~{3,}\s*$")
#: a Note opened as ``Note [title]: text`` (the old form, both definition and reference)
COLON_FORM = re.compile(r"^\s*(?:#:?|r?\"\"\")?\s*Note \[([^\]]+)\]:")


def _files() -> list[pathlib.Path]:
    out = [p for d in ("mucudnn", "tools", "tests") for p in sorted((ROOT / d).rglob("*"))
           if p.suffix in (".py", ".sh") and p.name != "test_notes.py"]
    return out + sorted((ROOT / "docs").glob("*.md"))


def _strip(line: str) -> str:
    return line.strip().removeprefix("#:").removeprefix("#").strip()


def scan() -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """Definitions ``{title: [where]}`` and references ``[(title, where)]``."""
    defs: dict[str, list[str]] = collections.defaultdict(list)
    refs: list[tuple[str, str]] = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        def_lines = set()
        for i, line in enumerate(lines[:-1]):
            m = TITLE_LINE.match(line.strip())
            if m and UNDERLINE.match(lines[i + 1].strip()):
                defs[m.group(1)].append(f"{rel}:{i + 1}")
                def_lines.add(i)
        # references, titles wrapped across lines included
        text = "\n".join(_strip(line) for line in lines)
        for m in MENTION.finditer(text):
            lineno = text.count("\n", 0, m.start())
            if lineno not in def_lines:
                refs.append((" ".join(m.group(1).split()), f"{rel}:{lineno + 1}"))
    return defs, refs


def test_each_note_is_defined_once_in_the_code():
    defs, _ = scan()
    assert len(defs) >= 40
    twice = {t: w for t, w in defs.items() if len(w) > 1}
    assert not twice, twice
    outside = {t: w for t, w in defs.items()
               if not w[0].startswith(("mucudnn/", "tools/"))}
    assert not outside, outside


def test_every_reference_names_a_defined_note():
    defs, refs = scan()
    dangling = [(t, w) for t, w in refs if t not in defs]
    assert not dangling, dangling


def test_no_note_is_opened_with_a_colon():
    """``Note [title]: text`` reads as both a definition and a reference."""
    bad = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix == ".md":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if COLON_FORM.match(line):
                bad.append(f"{rel}:{i + 1}")
    assert not bad, bad
