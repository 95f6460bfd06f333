"""What `import mucudnn` and `python -m mucudnn --version` load: none of the heavy
packages (Note [public names on first use] in mucudnn/__init__.py, Note
[commands load what they run] in mucudnn/__main__.py), and every public name
still there on first use."""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import subprocess
import sys

import pytest

import mucudnn

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Packages that take most of a second or more to import, or need a GPU stack.
HEAVY = ("scipy", "networkx", "tqdm", "ml_dtypes", "torch", "cuda.bindings", "matplotlib")

_REPORT = ("import json, sys; print(json.dumps(sorted(m for m, v in sys.modules.items() "
           f"if v is not None and (m in {HEAVY!r} or m.startswith(tuple(h + '.' for h in "
           f"{HEAVY!r}))))))")


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_import_mucudnn_loads_no_heavy_package():
    assert _loaded_after("import mucudnn") == []


def test_version_command_loads_no_heavy_package():
    code = ("import runpy, sys\nsys.argv = ['mucudnn', '--version']\n"
            "try:\n    runpy.run_module('mucudnn', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code")
    assert _loaded_after(code) == []


def test_help_loads_no_heavy_package():
    code = ("import runpy, sys\nsys.argv = ['mucudnn', 'bench', '--help']\n"
            "try:\n    runpy.run_module('mucudnn', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code")
    assert _loaded_after(code) == []


def _torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not _torch_gpu(), reason="torch sees no CUDA GPU")])])
def test_mucudnn_torch_and_a_float32_step_load_neither_dynamo_nor_ml_dtypes(device):
    """``import mucudnn.torch`` loads what torch itself does and mucudnn, none of
    torch._dynamo (Note [the WD hook outside torch.compile]), ml_dtypes (Note
    [bfloat16 on first use]), SciPy, networkx or tqdm (Note [heavy imports
    where they are used]); a converted model's float32 training step then
    loads neither torch._dynamo nor ml_dtypes. Each costs a training process
    up to a second at its start."""
    pytest.importorskip("torch", reason="mucudnn.torch needs PyTorch")
    heavy = ("torch._dynamo", "ml_dtypes", "scipy", "networkx", "tqdm")
    code = ("import sys, torch\n"
            "def new(before, names):\n"
            "    return sorted(n for n in set(sys.modules) - before\n"
            "                  if any(n == h or n.startswith(h + '.') for h in names))\n"
            "before = set(sys.modules)\nimport mucudnn.torch as mt\n"
            f"print(new(before, {heavy!r}))\n"
            f"m = mt.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))).to({device!r})\n"
            f"m(torch.randn(2, 3, 8, 8, device={device!r})).sum().backward()\n"
            "print(new(before, ('torch._dynamo', 'ml_dtypes')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip().splitlines()[-2:] == ["[]", "[]"]


def test_planning_a_kernel_loads_no_networkx():
    """See Note [no networkx on the planning path] (mucudnn/optimizer/dp.py): a
    Convolution's first call plans its kernels (under a limit that splits the
    batch) without importing networkx, which would cost a converted model's
    first step more than half a second."""
    code = ("import numpy as np, mucudnn as mu\n"
            "conv = mu.Convolution((16, 3, 12, 12), (8, 3, 3, 3), padding=1, backend='numpy',\n"
            "                      cache='off', workspace_limit=1 << 14, policy='all')\n"
            "conv.forward(np.ones((16, 3, 12, 12), np.float32), np.ones((8, 3, 3, 3), np.float32))\n"
            "assert conv.plans, conv.plans")
    assert "networkx" not in _loaded_after(code)


def test_version_command_prints_the_version():
    out = subprocess.run([sys.executable, "-m", "mucudnn", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == f"mucudnn {mucudnn.__version__}"


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the imports under ``if TYPE_CHECKING:`` in mucudnn/__init__.py."""
    tree = ast.parse((ROOT / "mucudnn" / "__init__.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1
                for alias in imp.names:
                    names[alias.asname or alias.name] = f"mucudnn.{imp.module}"
    return names


def test_every_public_name_resolves_to_what_type_checkers_see():
    declared = _type_checking_imports()
    eager = {n for n in mucudnn.__all__ if n in vars(mucudnn) and n not in declared}
    assert set(mucudnn.__all__) == eager | set(declared)
    for name, module in declared.items():
        assert getattr(mucudnn, name) is getattr(importlib.import_module(module), name), name
    assert set(mucudnn.__all__) <= set(dir(mucudnn))


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no_such_name"):
        mucudnn.no_such_name  # type: ignore[attr-defined]
    assert not hasattr(mucudnn, "no_such_name")


def test_rooms_reachable_as_attributes():
    assert mucudnn.optimizer.DEFAULT_POLICY == "fitted"
    assert mucudnn.cuda.BFLOAT16.itemsize == 2


@pytest.mark.slow
def test_without_cuda_bindings_the_cpu_works_and_gpu_use_names_the_install():
    # cuda-bindings is the cudnn extra's: its absence hides every GPU, and the first
    # GPU use says what to install (a NoDeviceError and a MissingDependencyError)
    code = """
import sys
sys.modules["cuda.bindings"] = None  # as if not installed
import numpy as np
import mucudnn as mu
from mucudnn.cuda import _runtime, device_count
conv = mu.Convolution((2, 3, 8, 8), (4, 3, 3, 3), padding=1, backend="numpy", cache="off")
y = conv.forward(np.ones((2, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32))
assert y.shape == (2, 4, 8, 8) and device_count() == 0 and _runtime.missing()
try:
    _runtime.get()
except mu.NoDeviceError as exc:
    assert isinstance(exc, mu.MissingDependencyError), type(exc)
    assert str(exc).endswith('pip install "mucudnn[cudnn]"'), str(exc)
else:
    raise AssertionError("no error")
"""
    assert "cuda.bindings" not in _loaded_after(code)
