"""tools/search_parity.py's host-side parts (the comparison itself needs a GPU)."""

from __future__ import annotations

import doctest

import pytest
from tool_support import load_tool

from mucudnn.problem import ConvProblem

pytest.importorskip("torch")
search_parity = load_tool("search_parity")


def test_find_options_parse_from_field_value_pairs():
    opts = search_parity.parse_find(["rtc=all", "top_k=None", "parity=False", "zero=once"])
    assert (opts.rtc, opts.top_k, opts.parity, opts.zero) == ("all", None, False, "once")
    with pytest.raises(SystemExit, match="field=value"):
        search_parity.parse_find(["rtc"])
    with pytest.raises(ValueError, match="rtc: expected one of"):
        search_parity.parse_find(["rtc=sometimes"])


def test_a_channels_last_convolution_in_torch_shapes_is_its_nhwc_problem():
    conv = {"x": (8, 32, 56, 56), "w": (32, 1, 3, 3), "stride": (2, 2), "padding": (1, 1),
            "dilation": (1, 1), "groups": 32}
    p = search_parity.problem_of(conv, "bfloat16")
    assert p == ConvProblem((8, 56, 56, 32), (32, 3, 3, 1), stride=2, padding=1, groups=32,
                            dtype="bfloat16", layout="NHWC")
    assert p.output_shape == (8, 28, 28, 32)


def test_a_model_cut_short_keeps_the_convolutions_checked_and_says_so():
    """check_model asks for time before each convolution and reports after each
    one: a run out of time keeps its rows, counts only what it checked and is
    marked incomplete; a failing check is a row, not the end of the model."""
    from mucudnn.problem import Direction

    convs = [{"layer": f"c{i}"} for i in range(4)]
    held = {("c0", "forward"), ("c0", "backward_data"), ("c1", "backward_filter")}

    def check_one(conv, d, precision, backend):
        if (conv["layer"], d.value) == ("c1", "forward"):
            raise RuntimeError("no such engine")
        return {"layer": conv["layer"], "direction": d.value, "torch_kernels": ["k"],
                "held": (conv["layer"], d.value) in held, "missing": []}

    asked, seen = [], []

    def out_of_time():
        asked.append(1)
        return len(asked) > 2  # time for two convolutions

    entry = search_parity.check_model("m", convs, "fp32cl", None, out_of_time,
                                      lambda e: seen.append((e["convs_checked"], e["held"])),
                                      check_one=check_one)
    assert (entry["convs"], entry["convs_checked"], entry["complete"]) == (4, 2, False)
    assert entry["kernels"] == 2 * len(Direction) and entry["held"] == 3
    assert seen == [(1, 2), (2, 3)]
    (err,) = [r for r in entry["results"] if "error" in r]
    assert (err["layer"], err["direction"], err["held"]) == ("c1", "forward", False)
    assert "RuntimeError: no such engine" in err["error"]
    rows = search_parity.rows_of("m", entry)
    assert len(rows) == 6 and "| m | c1 | forward | NO |" in rows[3]
    whole = search_parity.check_model("m", convs[:1], "fp32cl", None, lambda: False,
                                      check_one=check_one)
    assert whole["complete"] and whole["convs_checked"] == 1


def test_directions_that_fit_the_limit_are_rows_but_not_counted():
    """--over-limit: a direction whose PyTorch workspace fits is a row marked as
    fitting, outside the counts of directions compared and held."""
    from mucudnn.problem import Direction

    def check_one(conv, d, precision, backend):
        fits = d is not Direction.BACKWARD_FILTER
        return {"layer": conv["layer"], "direction": d.value, "torch_kernels": ["k"],
                "fits": fits, "held": None if fits else conv["layer"] == "c0", "missing": []}

    entry = search_parity.check_model("m", [{"layer": "c0"}, {"layer": "c1"}], "fp32cl", None,
                                      lambda: False, check_one=check_one)
    assert (entry["kernels"], entry["held"], entry["fit"]) == (2, 1, 4)
    rows = search_parity.rows_of("m", entry)
    assert "| m | c0 | forward | fits the limit |" in rows[0]
    assert "| m | c0 | backward_filter | yes |" in rows[2]
    assert "| m | c1 | backward_filter | NO |" in rows[5]


def test_the_over_limit_option_reads_a_size():
    with pytest.raises(SystemExit):
        search_parity.main(["--models", "resnet18", "--over-limit", "lots"])


def test_doctests():
    result = doctest.testmod(search_parity)
    assert result.attempted > 0 and result.failed == 0


def test_a_row_over_the_limit_shows_pytorchs_calls_on_micro_batches():
    """The last column: PyTorch's own call at the largest halving of the batch
    that fits, its time for the whole batch at that rate, whether mucudnn's
    search held its kernels there, and the whole batch's own time."""
    r = {"layer": "c0", "direction": "backward_filter", "torch_kernels": ["wgrad"],
         "fits": False, "held": True, "missing": [], "torch_ms": 4.5,
         "torch_under_limit": {"batch": 8, "workspace_bytes": 40 << 20, "ms": 0.6,
                               "ms_whole_batch": 4.8, "torch_kernels": ["wgrad_small"],
                               "held": False, "missing": ["wgrad_small"]}}
    entry = {"results": [r, dict(r, torch_under_limit=None)]}
    first, second = search_parity.rows_of("m", entry)
    assert first.endswith("| 4.800 ms (8 a call, 40.0 MiB, NOT held: wgrad_small; "
                          "whole batch 4.500 ms) |")
    assert second.endswith("| - |")
