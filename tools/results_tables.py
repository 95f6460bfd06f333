"""What every results table shares: reading docs/results/, the sources a
table cites, and the table's markdown (tools/results_page.py and
tools/results_zoo.py build their tables from these)."""

from __future__ import annotations

import gzip
import json
import pathlib
import re
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRECISION_LABEL = {"fp32": "fp32 NCHW", "fp32cl": "fp32 channels-last", "bf16cl": "bf16 channels-last",
                   "amp": "AMP bf16 channels-last", "fp32strict": "strict fp32 (no TF32)"}
MIB = 1 << 20
LIMIT = 64 * MIB  # the per-kernel workspace limit every headline number is taken at
NR = "not recorded"
#: The GPU the tables report: the issues' targets are set on it, and numbers
#: of different GPUs never share a table or a mean. Runs on other GPUs get
#: tables of their own (the ``zoo-elsewhere`` block); a file that records no
#: GPU was made before other GPUs were lent, on this one.
TABLE_GPU = "NVIDIA H200"


# -- reading ------------------------------------------------------------------------------------
def newness(name: str) -> tuple:
    """Sort key, oldest first: the date the name starts with, then the work session and
    call it names (``-s14-call8-``, or a part of a call, ``-s14-call8a-``; none:
    before numbered sessions), then the name without its extension
    (``x-final.json`` after ``x.json``)."""
    m = re.search(r"-s(\d+)-call(\d+)[a-z]?-", name)
    return (name[:10], int(m.group(1)) if m else 0, int(m.group(2)) if m else 0,
            name.split(".json")[0])


def load_results(folder: pathlib.Path) -> list[tuple[str, Any]]:
    """(file name, parsed JSON) of every result file, oldest first (:func:`newness`)."""
    out = []
    for p in sorted(folder.iterdir(), key=lambda p: newness(p.name)):
        if p.name.endswith((".json", ".json.gz")):
            opener: Any = gzip.open if p.name.endswith(".gz") else open
            with opener(p, "rt", encoding="utf-8") as f:
                out.append((p.name, json.load(f)))
    return out


def kind(doc: Any) -> str | None:
    if isinstance(doc, list):
        ok = bool(doc) and all(isinstance(r, dict) and "config" in r and "process_s" in r for r in doc)
        return "cold" if ok else None
    if not isinstance(doc, dict):
        return None
    if str(doc.get("schema", "")).startswith("mucudnn-frontier"):
        return "frontier"
    if {"runs", "args", "environment"} <= doc.keys():
        return "train"
    if "host_us" in doc:
        return "overhead"
    if {"results", "options", "environment"} <= doc.keys():
        # an A/A run (zoo_bench --control) measures the harness, not mucudnn
        return None if (doc["options"] or {}).get("control") else "zoo"
    if {"models", "options"} <= doc.keys() and isinstance(doc["models"], dict):
        return "parity"
    return None


def of_kind(results: list[tuple[str, Any]], k: str) -> list[tuple[str, Any]]:
    return [(n, d) for n, d in results if kind(d) == k]


def gpu_of(doc: Any) -> str:
    """The GPU a result file records (its environment's ``gpu`` or ``device``,
    or its own ``device``); :data:`TABLE_GPU` where it records none.

    >>> gpu_of({"environment": {"gpu": "NVIDIA H100 80GB HBM3"}})
    'NVIDIA H100 80GB HBM3'
    >>> gpu_of({"environment": {"device": "cuda"}}), gpu_of([])
    ('NVIDIA H200', 'NVIDIA H200')
    """
    if isinstance(doc, dict):
        env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
        for v in (env.get("gpu"), env.get("device"), doc.get("device")):
            if isinstance(v, str) and v and v.split(":")[0] not in ("cuda", "cpu"):
                return v  # a GPU's name, not torch's device string
    return TABLE_GPU


def on_gpu(results: list[tuple[str, Any]], gpu: str) -> list[tuple[str, Any]]:
    """The results made on ``gpu`` (:func:`gpu_of`)."""
    return [(n, d) for n, d in results if gpu_of(d) == gpu]


# -- what a source records ----------------------------------------------------------------------
def cudnn_text(v: Any) -> str:
    if isinstance(v, int):  # torch.backends.cudnn.version(): 91900
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return str(v) if v else NR


def commit_of(name: str, recorded: Any) -> str:
    if recorded:
        return str(recorded)[:10]
    m = re.search(r"-([0-9a-f]{7,40})(?=[.-])", name)
    return f"{m.group(1)} (file name)" if m else NR


def source_line(name: str, date: Any = None, device: Any = None, cudnn: Any = None,
                torch: Any = None, commit: Any = None, defaults: str = NR) -> str:
    day = name[:10] if re.match(r"\d{4}-\d\d-\d\d", name) else NR
    return (f"`{name}`: commit {commit_of(name, commit)}; date {date or day}; "
            f"device {device or NR}; cuDNN {cudnn_text(cudnn)}; torch {torch or NR}; {defaults}")


class Sources(dict):
    """{file: (number, source line)}, numbered in the order a table first cites them."""

    def cite(self, name: str, line: str) -> str:
        return f"[{self.setdefault(name, (len(self) + 1, line))[0]}]"

    def text(self) -> str:
        return "Sources:\n\n" + "\n".join(f"{i}. {line}" for i, line in self.values())


def side_peak(memory: Any) -> int | None:
    """The peak bytes a zoo file compares for one side (its ``memory[side]``):
    the peak of requested bytes where the file records it, else the peak of
    allocated bytes (Note [memory per side] in tools/zoo_bench.py)."""
    memory = memory or {}
    requested = memory.get("requested_peak_bytes")
    return requested if requested is not None else memory.get("peak_bytes")


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def finish(head: list[str], rows: list[list[str]], src: Sources, tool: str) -> str:
    """The table and its sources, or what measures it while nothing has."""
    if not rows:
        return f"Not measured yet (`tools/{tool} --json docs/results/...`).\n"
    return table(head, rows) + "\n\n" + src.text() + "\n"


def pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{100 * (a / b - 1):+.1f}%"


def num(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)
