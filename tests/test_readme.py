"""Every shell command and Python block of README.md and docs/guide.md runs as printed.

Blocks run in order (README's, then the guide's) in one scratch folder (a later block may read what
an earlier one wrote, as a reader following along would), with a private
benchmark cache and ``tests/`` reachable as in a checkout. A block is skipped
only when the README says why, in a comment on the line before it:

* ``<!-- readme-test: skip: <reason> -->``: never run here (installing
  packages, running this test suite);
* ``<!-- readme-test: needs gpu torch -->``: run where a CUDA GPU and the named
  modules are present, skipped with that reason elsewhere.

A fenced block in any other language than bash or python (or text, which is
not run) fails the test, so no README command goes untested by accident.
Without a GPU the quick start runs on the NumPy backend at its CPU batch
(about 3 min on two cores with its empty cache); nothing else here takes more
than a few seconds.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from conftest import HAVE_GPU

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = (README, ROOT / "docs" / "guide.md")
RUN = {"bash": "bash", "sh": "bash", "python": "python"}
#: A generous guard against a hang (a cold GPU benchmark of AlexNet takes ~90 s).
TIMEOUT_S = 900


@dataclass
class Block:
    lang: str
    code: str
    line: int
    marker: str | None
    doc: str = "README.md"

    @property
    def label(self) -> str:
        first = self.code.strip().splitlines()[0]
        return f"{self.doc}:{self.line} {first[:60]}"

    def skip_reason(self) -> str | None:
        if self.marker is None:
            return None
        m = re.fullmatch(r"skip:\s*(.+)", self.marker)
        if m:
            return m.group(1)
        m = re.fullmatch(r"needs\s+(.+)", self.marker)
        assert m, f"{self.doc}:{self.line}: unknown readme-test marker {self.marker!r}"
        missing = []
        for need in m.group(1).split():
            if need == "gpu":
                if not HAVE_GPU:
                    missing.append("a CUDA GPU")
            elif importlib.util.find_spec(need) is None:
                missing.append(need)
        return f"needs {' and '.join(missing)}" if missing else None


def readme_blocks(text: str, doc: str = "README.md") -> list[Block]:
    """The fenced code blocks of ``text`` with the readme-test marker before each."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = re.fullmatch(r"<!--\s*readme-test:\s*(.*?)\s*-->", prev)
        blocks.append(Block(m.group(1), "\n".join(body) + "\n", start + 1,
                            mark.group(1) if mark else None, doc))
        i += 1
    return blocks


BLOCKS = [b for path in DOCS for b in readme_blocks(path.read_text(), str(path.relative_to(ROOT)))
          if b.lang != "text"]


def test_readme_blocks_are_all_runnable_kinds():
    assert len(BLOCKS) >= 6
    odd = [b.label for b in BLOCKS if b.lang not in RUN]
    assert not odd, f"fenced blocks this test cannot run (use bash, python or text): {odd}"
    assert any("python -m mucudnn bench" in b.code and b.marker is None for b in BLOCKS)


def test_block_parser():
    text = ("intro\n<!-- readme-test: skip: why -->\n\n```bash\necho a\n```\n"
            "```python\nprint(1)\n```\n")
    a, b = readme_blocks(text)
    assert (a.lang, a.code, a.line, a.marker) == ("bash", "echo a\n", 4, "skip: why")
    assert (b.lang, b.code, b.marker) == ("python", "print(1)\n", None)
    assert a.skip_reason() == "why" and b.skip_reason() is None


class Session:
    """Runs README blocks in order, each once, in one scratch folder."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        (folder / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
        env = dict(os.environ)
        for var in ("MUCUDNN_BACKEND", "MUCUDNN_WORKSPACE_LIMIT", "MUCUDNN_CACHE"):
            env.pop(var, None)  # as a new user's shell
        env["MUCUDNN_CACHE"] = str(folder / "benchmarks.sqlite")
        env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                       env.get("PATH", "")])
        self.env = env
        self.results: dict[int, subprocess.CompletedProcess] = {}
        self.done = 0

    def run_through(self, index: int) -> subprocess.CompletedProcess:
        while self.done <= index:
            block = BLOCKS[self.done]
            if block.skip_reason() is None:
                self.results[self.done] = self._run(block)
            self.done += 1
        return self.results[index]

    def _run(self, block: Block) -> subprocess.CompletedProcess:
        if RUN[block.lang] == "bash":
            argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
        else:
            argv = [sys.executable, "-c", block.code]
        return subprocess.run(argv, cwd=self.folder, env=self.env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return Session(tmp_path_factory.mktemp("readme"))


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[b.label for b in BLOCKS])
def test_readme_block_runs(session, index):
    block = BLOCKS[index]
    reason = block.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    r = session.run_through(index)
    shown = f"\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"{block.label} exited with {r.returncode}{shown}"
    assert "Traceback" not in r.stderr, shown
