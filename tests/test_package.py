"""The package as a new user meets it: version, license, changelog, type
information, its overview's examples, and one exception base for every error."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pathlib
import tomllib
from importlib.metadata import version

import pytest

import mucudnn

from conftest import needs_cudnn

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_one_version():
    # pyproject takes it from the package's one literal (readable without importing
    # mucudnn, whose dependencies a build environment lacks); the metadata agrees
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "mucudnn._version.__version__"}
    assert version("mucudnn") == mucudnn.__version__


def test_typed_package_ships_its_marker():
    assert (ROOT / "mucudnn" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["mucudnn"]


def test_license_is_mit_as_declared():
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == {"text": "MIT"}
    assert text.startswith("MIT License") and "the mucudnn authors" in text


def test_changelog_has_unreleased_and_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert f"## [{mucudnn.__version__}] - " in text
    assert text.index("## [Unreleased]") < text.index(f"## [{mucudnn.__version__}]")


def test_overview_names_the_three_ways_in():
    doc = mucudnn.__doc__
    for name in ("Convolution", "conv2d", "MicroBatchHandle", "optimize", "load_plans",
                 "python -m mucudnn", "README"):
        assert name in doc, name


@pytest.mark.parametrize("module", ["mucudnn", "mucudnn.plans_io", "mucudnn._optional",
                                    "mucudnn.units", "mucudnn.__main__", "mucudnn.problem",
                                    "mucudnn.problem.conv_problem", "mucudnn.problem.plan",
                                    "mucudnn.problem.layouts", "mucudnn.problem.slice_problem",
                                    "mucudnn.backends.cudnn_graph", "mucudnn.backends.graph_candidates",
                                    # its examples call the loaded libcudnn (the cudnn extra)
                                    pytest.param("mucudnn._cudnn.prototypes", marks=needs_cudnn),
                                    "mucudnn._cudnn.graph_descriptors"])
def test_docstring_examples_run_on_the_cpu(module, monkeypatch, tmp_path):
    monkeypatch.setenv("MUCUDNN_CACHE", str(tmp_path / "cache.sqlite"))
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_every_exported_error_is_a_mucudnn_error():
    errors = [obj for name in mucudnn.__all__
              if inspect.isclass(obj := getattr(mucudnn, name))
              and issubclass(obj, BaseException) and not issubclass(obj, Warning)]
    assert mucudnn.MucudnnError in errors and len(errors) > 4
    for cls in errors:
        assert issubclass(cls, mucudnn.MucudnnError), cls
        # and the builtin it derives from, so old except clauses still catch it
        assert cls is mucudnn.MucudnnError or any(
            b.__module__ == "builtins" and b not in (Exception, BaseException, object)
            for b in cls.__mro__[1:]), cls
