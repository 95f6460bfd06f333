"""Shared test setup: the `gpu` marker skips cleanly without a GPU; hypothesis profiles."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

# conv_support holds helpers with asserts that used to live in test files: keep
# pytest's assertion messages for them (must run before anything imports it).
pytest.register_assert_rewrite("conv_support")

settings.register_profile(
    "ci", max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "gpu", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "thorough", max_examples=400, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "fuzz10k", max_examples=10_000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Converted layers search plans for every convolution here, so the tests of the
# plan path exercise plans; tests of the default, PyTorch-first search set it
# themselves (Note [plans only over the limit], mucudnn/torch/native.py).
os.environ.setdefault("MUCUDNN_TORCH_SEARCH", "all")
# and plan at a signature's first call, so that one call shows its plans; the tests
# of stand-ins set it themselves (Note [planning after the first step],
# mucudnn/torch/standin.py)
os.environ.setdefault("MUCUDNN_TORCH_DEFER", "0")

DATA = pathlib.Path(__file__).parent / "data"


def _have_gpu() -> bool:
    try:
        from mucudnn.cuda import device_count
    except Exception:
        return False
    try:
        return device_count() > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()


def _have_cudnn() -> bool:
    try:
        from mucudnn._cudnn import loader
        loader.library()
    except Exception:
        return False
    return True


#: Whether a libcudnn loads (the cudnn extra, or MUCUDNN_CUDNN_LIBRARY); tests of
#: the binding skip cleanly without one.
HAVE_CUDNN = _have_cudnn()
needs_cudnn = pytest.mark.skipif(not HAVE_CUDNN, reason="no libcudnn loads here (install the "
                                 "cudnn extra: pip install \"mucudnn[cudnn]\")")


def _cudnn_transforms() -> bool:
    """Whether cuDNN's tensor transform descriptors can be set here. From cuDNN
    9.28 setting one loads the runtime-compiled engines, which link the CUDA
    driver library (as every backend finalize does: mucudnn/_cudnn/backend_api.py),
    so without a GPU it fails with CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED. Any
    other failure, or one on a GPU machine, is left to the tests to show."""
    if not HAVE_CUDNN:
        return False
    from mucudnn._cudnn.descriptors import TensorTransformDescriptor
    from mucudnn._cudnn.enums import Status
    from mucudnn._cudnn.errors import CudnnError
    try:
        TensorTransformDescriptor([0, 0, 0, 0], [0, 0, 1, 1], [2, 2]).close()
    except CudnnError as exc:
        return HAVE_GPU or exc.status != Status.SUBLIBRARY_LOADING_FAILED
    return True


#: Tests that set tensor transform descriptors (folded convolutions).
needs_cudnn_transforms = pytest.mark.skipif(
    not _cudnn_transforms(), reason="no libcudnn here, or one whose transform descriptors need "
    "the CUDA driver (cuDNN 9.28 and later without a GPU)")


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private benchmark cache file for one test."""
    path = tmp_path / "cache.sqlite"
    monkeypatch.setenv("MUCUDNN_CACHE", str(path))
    return path


@pytest.fixture(scope="module")
def cache_off():
    """For a whole module: no benchmark cache (``MUCUDNN_CACHE=off``) and no
    workspace cap from the environment (``MUCUDNN_WORKSPACE_LIMIT`` unset).
    Modules take it with ``pytestmark = pytest.mark.usefixtures("cache_off")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUCUDNN_CACHE", "off")
        mp.delenv("MUCUDNN_WORKSPACE_LIMIT", raising=False)
        yield
