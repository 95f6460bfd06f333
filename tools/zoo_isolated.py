"""zoo_bench.py's ``--isolate``: each model in a child process of its own
(Note [isolated models]; a module zoo_bench.py imports)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import zoo_cold  # tools/: the child's environment

__all__ = ["run_isolated", "isolated_rows", "stop_children_on_sigterm"]


# Note [isolated models]
# ~~~~~~~~~~~~~~~~~~~~~~
# A crash in native code (a segmentation fault in a convolution library) ends
# the process, and with it every model after the one that crashed. With
# --isolate each model runs in a child process (zoo_bench.py, the same
# options, that one model with every precision asked for, its own --json),
# whose output goes to the parent's; the child saves its JSON before and after
# every stage, so what it measured before dying is kept, and its exit status
# is recorded as an error on the precision it was measuring and on those it
# never reached. A child costs a process start, CUDA's initialisation and its
# teardown, several seconds, so there is one per model, not per precision:
# the rows of one model share nothing they measure (plans and PyTorch's
# benchmark choices are per dtype; cached blocks and mucudnn's workspace are
# freed between rows, ``train_steps.cleanup``). The backend a later row's first
# calls find already made shows only in the report's first-call seconds; cold
# first steps run in fresh processes of their own (Note [cold steps]). A parent
# stopped by SIGTERM kills its child on the way out
# (:func:`stop_children_on_sigterm`), so that no orphan goes on using the GPU.
def run_isolated(script: str, argv: Sequence[str], args: argparse.Namespace,
                 name: str) -> list[dict]:
    """One model, each of ``args.precisions`` in turn, in a child process
    running ``script`` (zoo_bench.py) with ``argv`` (Note [isolated models]):
    its rows, in the order of ``args.precisions``."""
    with tempfile.TemporaryDirectory(prefix="zoo-model-") as tmp:
        out = os.path.join(tmp, "model.json")
        cmd = [sys.executable, script, *argv, "--models", name,
               "--precisions", *args.precisions, "--json", out, "--no-progress",
               "--max-seconds", "inf"]
        cmd.remove("--isolate")  # spelled out: the parser takes no abbreviations
        timeout = args.timeout * len(args.precisions)
        try:
            rc = subprocess.run(cmd, env=zoo_cold.child_env(), timeout=timeout,
                                stdout=subprocess.DEVNULL).returncode
            status = f"exited {rc}" if rc not in (0, 1) else None
        except subprocess.TimeoutExpired:
            status = f"timed out after {timeout:.0f} s"
        try:
            with open(out, encoding="utf-8") as f:
                found = {e["precision"]: e for e in json.load(f)["results"]}
        except (OSError, ValueError, KeyError, TypeError):
            found = {}
    return isolated_rows(name, args.precisions, found, status)


def isolated_rows(name: str, precisions: Sequence[str], found: dict[str, dict],
                  status: str | None) -> list[dict]:
    """A child's rows for ``name`` (Note [isolated models]): ``found`` by
    precision, an empty row for each precision it has none of, and, where the
    child ended badly (``status``), that error on the last row it began and on
    every row it never reached.

    >>> rows = isolated_rows("m", ["fp32cl", "amp"], {"fp32cl": {"model": "m",
    ...     "precision": "fp32cl", "steps": {"eager": {}}, "errors": {}}}, "exited -11")
    >>> [(r["precision"], r["errors"]["process"]) for r in rows]
    [('fp32cl', 'isolated process exited -11'), ('amp', 'isolated process exited -11')]
    >>> isolated_rows("m", ["amp"], {}, None)[0]["errors"]
    {}
    """
    rows, began = [], None
    for p in precisions:
        row = found.get(p)
        if row is None:
            row = {"model": name, "precision": p, "steps": {}, "errors": {}}
            if status is not None:
                row.setdefault("errors", {})["process"] = f"isolated process {status}"
        else:
            began = row
        rows.append(row)
    if status is not None and began is not None:
        began.setdefault("errors", {})["process"] = f"isolated process {status}"
    return rows


def stop_children_on_sigterm() -> Any:
    """Make SIGTERM (``timeout``'s signal, as tools/gpu_run.sh runs this script)
    raise SystemExit in this process, so that the child ``subprocess.run`` waits
    on is killed as the exception passes (Note [isolated models]) rather than
    left running on the GPU under the stages after; returns the handler it
    replaced."""
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)
    return signal.signal(signal.SIGTERM, stop)
