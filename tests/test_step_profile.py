"""tools/step_profile.py on the CPU: kernel categories, the matching of
convolution ops by their place in the step, and a smoke run (``--device cpu
--model tiny``) whose JSON lists every convolution of the step, forward then
backward, for native and converted alike."""

from __future__ import annotations

import doctest
import json
import statistics
from types import SimpleNamespace

import pytest
from tool_support import load_tool

pytest.importorskip("torch", reason="tools/step_profile.py needs PyTorch")
from torch.autograd import DeviceType  # noqa: E402


@pytest.fixture(scope="module")
def sp():
    return load_tool("step_profile")


pytestmark = pytest.mark.usefixtures("cache_off")


def test_doctests(sp):
    result = doctest.testmod(sp)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name, cat", [
    ("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "conv"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>",
     "conv"),
    ("cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4", "conv"),
    ("void at::native::batch_norm_backward_channels_last_kernel<float>", "batch norm"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
     "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
    ("Memcpy DtoD (Device -> Device)", "memset/memcpy"),
    ("void at::native::max_pool_backward_nhwc<float, float>", "other"),
])
def test_category(sp, name, cat):
    assert sp.category(name) == cat


def _ev(name, start, end, shapes=()):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           device_type=DeviceType.CPU, input_shapes=list(shapes),
                           device_time_total=(end - start) * 10.0)


def test_conv_calls_takes_the_outermost_op_of_the_last_step(sp):
    events = [  # two steps of one forward and one backward; a nested custom op
        _ev("ConvFunction", 0, 10, [[2, 3, 8, 8], [4, 3, 3, 3]]),
        _ev("mucudnn::conv", 1, 9),
        _ev("aten::relu", 11, 12),
        _ev("ConvFunctionBackward", 20, 30, [[2, 4, 6, 6]]),
        _ev("ConvFunction", 100, 110, [[2, 3, 8, 8], [4, 3, 3, 3]]),
        _ev("ConvFunctionBackward", 120, 135, [[2, 4, 6, 6]]),
    ]
    prof = SimpleNamespace(events=lambda: events)
    calls = sp.conv_calls(prof, steps=2)
    assert [c["op"] for c in calls] == ["ConvFunction", "ConvFunctionBackward"]
    assert [c["ms"] for c in calls] == [0.1, 0.15]
    assert calls[0]["shapes"] == [[2, 3, 8, 8], [4, 3, 3, 3]]


def _kernel(start, end):
    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name="Memset (Device)", time_range=span)


def test_busy_time_counts_kernels_on_two_streams_at_once_once(sp):
    # two lanes at once (300-700 inside 0-1000), one nested in another, a gap, one more
    lanes = [_kernel(0, 1000), _kernel(300, 700), _kernel(900, 1400), _kernel(2000, 2600)]
    assert sp.busy_ms(lanes, steps=2) == pytest.approx((1400 + 600) / 1e3 / 2)
    # the kernel time sums them: the lanes count twice
    assert sp.by_category(lanes, steps=2)["all"] == pytest.approx((1000 + 400 + 500 + 600) / 2e3)
    assert sp.busy_ms(list(reversed(lanes)), steps=1) == pytest.approx(2.0)  # order free
    assert sp.busy_ms([], steps=1) == 0.0


def test_diff_rows_rank_kernels_by_their_difference(sp):
    names = {"native": {"a": (1.0, 1), "b": (2.0, 2)},
             "wr": {"a": (1.05, 1), "b": (1.0, 4), "c": (0.5, 3)}}
    rows = sp.diff_rows(names, ["native", "wr"], top=2)
    assert rows[2].startswith("| `b` | 2.000 (2) | 1.000 (4)")
    assert rows[3].startswith("| `c` | 0.000 (0) | 0.500 (3)")
    assert len(rows) == 4


@pytest.mark.slow
def test_smoke_run_lists_every_convolution_in_step_order(sp, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert sp.main(["--device", "cpu", "--model", "tiny", "--execution", "eager", "--steps", "2",
                    "--timed-rounds", "1", "--warmup", "1", "--host-profile", "2",
                    "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    for mode in ("native", "wr"):  # the host profile: times, and its functions
        h = r["per_mode"][mode]["host"]
        assert h["issue_ms"] > 0 and h["profiled_issue_ms"] > 0 and h["steps"] == 2
        assert len(h["issue_rounds_ms"]) == sp.HOST_ROUNDS  # the modes in turn
        assert h["issue_ms"] == statistics.median(h["issue_rounds_ms"])
        assert h["functions"]["self"] and all(f["calls"] > 0 for f in h["functions"]["self"])
    names = [f["function"] for f in r["per_mode"]["wr"]["host"]["functions"]["cumulative"]]
    assert any("mucudnn/torch/" in n for n in names)  # the converted layers' calls
    assert r["modes"] == ["native", "wr"] and r["model"] == "tiny"
    for mode, fwd, bwd in (("native", "aten::convolution", "aten::convolution_backward"),
                           ("wr", "ConvFunction", "ConvFunctionBackward")):
        ops = [c["op"] for c in r["per_mode"][mode]["conv_calls"]]
        assert ops == [fwd] * 3 + [bwd] * 3, (mode, ops)
        assert r["per_mode"][mode]["step_ms"] > 0
        pm = r["per_mode"][mode]  # nothing on a GPU: no kernel, no busy time
        assert pm["busy_ms"] <= pm["kernel_ms"].get("all", 0.0) + 1e-9
        assert pm["idle_ms"] == pytest.approx(pm["step_ms"] - pm["busy_ms"])
    # the forward calls name the same layers in the same order
    shapes = [[c["shapes"][1] for c in r["per_mode"][m]["conv_calls"][:3]] for m in r["modes"]]
    assert shapes[0] == shapes[1]
    assert "Convolution ops in step order" in capsys.readouterr().out


def test_bad_arguments_are_refused(sp):
    for bad in (["--model", "lenet"], ["--steps", "0"], ["--device", "cpu", "--policy", "bogus"]):
        with pytest.raises(SystemExit):
            sp.parse_args(bad)
