"""tools/workspace_anatomy.py on the CPU: the classes, the rows, the filters, the shipped
H200 cache (float32 NCHW), and argument errors."""

from __future__ import annotations

import json

import pytest
from tool_support import load_tool

from mucudnn.optimizer.cache import BenchmarkCache, Entry
from mucudnn.problem import AlgoPerf, ConvProblem

UNCAPPED = 1 << 40


@pytest.fixture(scope="module")
def wa():
    return load_tool("workspace_anatomy")


def _entry(p: ConvProblem, direction: str, results, cap: int = UNCAPPED,
           backend: str = "cudnn-graph") -> Entry:
    return Entry(backend, "NVIDIA H200", "9.19.0", p.key(), direction, cap, results)


def test_operand_bytes_and_classes(wa):
    p = ConvProblem((32, 4, 8, 8), (6, 4, 3, 3), padding=1)  # y: 32x6x8x8
    assert wa.operand_bytes(p) == 4 * (32 * 4 * 64 + 32 * 6 * 64 + 6 * 4 * 9)
    half = ConvProblem((32, 8, 8, 4), (6, 3, 3, 4), padding=1, dtype="bfloat16", layout="NHWC")
    assert wa.operand_bytes(half) == wa.operand_bytes(p) // 2
    n = wa.operand_bytes(p)
    assert [wa.classify(w, n) for w in (0, n // 20, n // 2, int(n * 0.9), n, int(n * 1.2),
                                        2 * n)] == [
        "small", "small", "other", "copies", "copies", "copies", "other"]
    assert wa.engine("e68;k2=0;k13=1") == "e68" and wa.engine(3) == "3"


def test_rows_count_the_fastest_config_of_each_qualifying_entry(wa, tmp_path):
    p = ConvProblem((64, 16, 14, 14), (32, 16, 3, 3), padding=1)
    n = wa.operand_bytes(p)
    fast_copy = [AlgoPerf("e68;k2=0", 1.0, n), AlgoPerf("e20", 2.0, 0)]
    fast_small = [AlgoPerf("e68;k2=0", 2.0, n), AlgoPerf("e20", 1.0, 0)]
    entries = [
        _entry(p, "backward_filter", fast_copy),
        _entry(p.with_batch(32), "backward_filter", fast_small),
        _entry(p, "forward", [AlgoPerf("e67", 1.0, 3 * n)]),                 # other
        _entry(p.with_batch(8), "forward",                                   # batch < 32
               [AlgoPerf("e67", 1.0, wa.operand_bytes(p.with_batch(8)))]),
        _entry(p.with_batch(48), "backward_data", fast_copy, cap=64 << 20),  # capped
        _entry(p, "backward_data", fast_copy, backend="cudnn"),              # other backend
    ]
    path = tmp_path / "c.sqlite"
    with BenchmarkCache(path) as c:
        assert c.put_many(entries) == len(entries)
    out = tmp_path / "a.json"
    assert wa.main(["--cache", str(path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by = {r["direction"]: r for r in rows}
    assert set(by) == {"backward_filter", "forward"}
    bf, fw = by["backward_filter"], by["forward"]
    assert (bf["kernels"], bf["copies"], bf["small"], bf["other"]) == (2, 1, 1, 0)
    assert bf["copies_engines"] == {"e68": 1}
    assert (fw["kernels"], fw["copies"], fw["small"], fw["other"]) == (1, 0, 0, 1)
    # lower the batch floor: the batch-8 forward entry (fastest: copies) joins
    fw8 = {r["direction"]: r for r in wa.anatomy(entries, min_batch=8)}["forward"]
    assert (fw8["kernels"], fw8["copies"], fw8["copies_engines"]) == (2, 1, {"e67": 1})


def test_shipped_cache_is_float32_nchw_and_every_kernel_is_classed(wa, capsys):
    assert wa.main([]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| float32")]
    assert len(lines) == 3 and all("| NCHW |" in line for line in lines)
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        kernels = int(cells[3])
        assert kernels > 0 and sum(int(c.split()[0]) for c in cells[4:7]) == kernels


def test_argument_errors(wa, tmp_path):
    with pytest.raises(SystemExit):
        wa.main(["--min-batch", "0"])
    with pytest.raises(Exception, match="does not exist"):
        wa.main(["--cache", str(tmp_path / "missing.sqlite")])


def test_doctests(wa):
    import doctest
    result = doctest.testmod(wa)
    assert result.attempted > 0 and result.failed == 0
