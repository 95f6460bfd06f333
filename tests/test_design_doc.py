"""docs/DESIGN.md's cache table names every cache the code creates, and clear_caches
empties them; in-memory state stays bounded over many distinct problems."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mucudnn as mu
from mucudnn.caches import LRU, live_caches

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "DESIGN.md"
ROOT = pathlib.Path(__file__).resolve().parent.parent / "mucudnn"


def _table_names() -> set[str]:
    text = DOC.read_text()
    section = text.split("## Caches", 1)[1]
    return set(re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M))


def _code_names() -> set[str]:
    names = set()
    for f in ROOT.rglob("*.py"):
        names |= set(re.findall(r'LRU\(\s*"([a-z_.]+)"', f.read_text()))
    return names - {"example"}  # the doctest in caches.py


def test_the_table_lists_every_cache_in_the_code():
    assert _code_names() == _table_names()


def test_clear_caches_empties_every_live_cache(monkeypatch):
    monkeypatch.setenv("MUCUDNN_CACHE", "off")
    conv = mu.Convolution((4, 2, 5, 5), (3, 2, 3, 3), backend="numpy", policy="undivided")
    conv.forward(np.ones((4, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32))
    mu.conv2d(np.ones((2, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32),
              backend="numpy")
    assert any(len(c) for c in live_caches())
    assert {c.name for c in live_caches()} <= _table_names() | {"example"}
    mu.clear_caches()
    assert all(len(c) == 0 for c in live_caches())


def test_lru_evicts_and_releases():
    dropped = []
    c = LRU("test", 2, on_evict=lambda k, v: dropped.append(k))
    for k in "abc":
        c.put(k, k.upper())
    assert c.keys() == ["b", "c"] and dropped == ["a"]
    assert c.get("b") == "B" and c.keys() == ["c", "b"]
    c.put("d", "D")
    assert dropped == ["a", "c"]
    c.clear()
    assert dropped == ["a", "c", "b", "d"] and len(c) == 0


@pytest.mark.slow
def test_ten_thousand_problems_grow_rss_by_less_than_50_mb():
    """Every distinct problem through Convolution on the NumPy backend (cache off):
    plans, bindings and pools are bounded, so memory does not grow with the count."""
    script = textwrap.dedent("""
        import os, resource, numpy as np
        os.environ["MUCUDNN_CACHE"] = "off"
        import mucudnn as mu
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        w = np.ones((2, 1, 1, 1), np.float32)
        for i in range(200):  # warm-up: imports, first allocations
            mu.Convolution((1, 1, 1, 1 + i), (2, 1, 1, 1), backend="numpy",
                           policy="undivided").forward(np.ones((1, 1, 1, 1 + i), np.float32), w)
        before = rss()
        for i in range(10_000):
            n = 1 + i % 4
            width = 1 + i // 4
            conv = mu.Convolution((n, 1, 1, width), (2, 1, 1, 1), backend="numpy",
                                  policy="undivided")
            conv.forward(np.ones((n, 1, 1, width), np.float32), w)
        print((rss() - before) / 2**20)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=900)
    grew = float(out.stdout.strip().splitlines()[-1])
    assert grew < 50, f"RSS grew by {grew:.1f} MiB over 10,000 problems"


