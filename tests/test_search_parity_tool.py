"""tools/search_parity.py's host-side parts (the comparison itself needs a GPU)."""

from __future__ import annotations

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
