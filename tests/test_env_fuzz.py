"""Every environment variable mucudnn reads, fuzzed with hostile values.

The variables (``grep -rn "environ\\|getenv" mucudnn/``): MUCUDNN_CACHE (and
XDG_CACHE_HOME, which places the default cache), MUCUDNN_BACKEND,
MUCUDNN_WORKSPACE_LIMIT, MUCUDNN_TORCH_NATIVE and MUCUDNN_CUDNN_LIBRARY. For
each value the reader either accepts it (and the result is checked against
what the value means) or raises a MucudnnError whose message names the
variable; nothing aborts the process. MUCUDNN_CUDNN_LIBRARY loads a shared
library, which can abort the process it runs in (Note [cuDNN's sub-libraries]
in mucudnn/_cudnn/loader.py), so its values are tried in a forked child.

An environment variable cannot hold a NUL character (execve passes
NUL-terminated strings; ``os.environ`` refuses one with ValueError), so NUL
is left to the argument tests (tests/test_cache_faults.py).
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mucudnn import units
from mucudnn.backends import available_backends, get_backend
from mucudnn.errors import MucudnnError
from mucudnn.exec.workspace import env_workspace_limit
from mucudnn.optimizer.cache import BenchmarkCache
from mucudnn.optimizer.cache_store import DEFAULT_NAME, default_cache_path
from mucudnn.problem import AlgoPerf, ConvProblem, Direction

from conftest import HAVE_CUDNN

FIXTURES_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                              HealthCheck.too_slow])
BE = ("fake", "Fake Device", "1")
P = ConvProblem((2, 3, 5, 5), (4, 3, 3, 3))
GOOD = [AlgoPerf(1, 0.5, 0)]

#: Text an environment variable can hold: no NUL (and no lone surrogates,
#: which os.environ cannot encode).
_env_text = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
                    max_size=40)
_numbers = st.one_of(st.integers(-(1 << 80), 1 << 80).map(str),
                     st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.builds(lambda n, u: f"{n}{u}", st.integers(-5, 1 << 70),
                               st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "kb", " G",
                                                "PiB", "EiB", "ZiB", "YiB", "xB"])))


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A folder of hostile places; HOME and the working directory inside it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "text.txt").write_text("not a cache\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return tmp_path


def _places(root) -> list[str]:
    return [str(root / "dir"), f"{root}/dir/", str(root / "text.txt"), str(root / "dangling"),
            str(root / "to-dir"), str(root / "loop"), f"{root}/new/deeper/",
            "/dev/null", "/dev/zero", "/proc/self/mem", "/", ".", "..", "~", "~/",
            "~nosuchuser-mucudnn/c.sqlite", "~nosuchuser-mucudnn/", "x" * 5000,
            "/" + "d/" * 3000, "off", "OFF ", "0", "none", "", " ", "c.sqlite", "\u00e9\u4e2d.sqlite"]


def _hostile(root):
    return st.one_of(st.sampled_from(_places(root)), _env_text, _numbers)


# -- MUCUDNN_CACHE and XDG_CACHE_HOME ------------------------------------------------------------
@pytest.mark.slow
@FIXTURES_OK
@given(data=st.data())
def test_mucudnn_cache_values(sandbox, monkeypatch, data):
    value = data.draw(_hostile(sandbox), "MUCUDNN_CACHE")
    monkeypatch.setenv("MUCUDNN_CACHE", value)
    try:
        path = default_cache_path()
    except MucudnnError as exc:
        assert "MUCUDNN_CACHE" in str(exc) and repr(value) in str(exc)
        return
    stripped = value.strip()
    if stripped.lower() in ("off", "0", "false", "no", "none", "disable", "disabled"):
        assert path is None
        return
    if not stripped:  # unset: the default place under HOME
        assert path == sandbox / "home" / ".cache" / "mucudnn" / DEFAULT_NAME
    elif value.endswith("/"):
        assert path is not None and path.name == DEFAULT_NAME
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a disabled or read-only cache says so: accepted
        try:
            with BenchmarkCache() as c:
                c.put(BE, P, Direction.FORWARD, GOOD, 1 << 20)
                got = c.get(BE, P, Direction.FORWARD, 1 << 20)
                # stored where writable; else a miss, never a different entry
                assert got in (GOOD, None)
                if got is None:
                    assert not c.enabled or c.read_only
        except MucudnnError as exc:
            named = "MUCUDNN_CACHE" if stripped else "the default cache file"
            assert named in str(exc) and str(path) in str(exc), str(exc)
            assert isinstance(exc, (OSError, ValueError, TypeError))


@FIXTURES_OK
@given(data=st.data())
def test_xdg_cache_home_values(sandbox, monkeypatch, data):
    value = data.draw(_hostile(sandbox), "XDG_CACHE_HOME")
    monkeypatch.delenv("MUCUDNN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", value)
    path = default_cache_path()
    assert path is not None and path.name == DEFAULT_NAME
    if not os.path.isabs(value):  # the spec: a relative value is ignored
        assert path == sandbox / "home" / ".cache" / "mucudnn" / DEFAULT_NAME


# -- MUCUDNN_BACKEND ---------------------------------------------------------------------------
@FIXTURES_OK
@given(value=st.one_of(_env_text, st.sampled_from(
    [n.upper() for n in available_backends()] + [f" {n} " for n in available_backends()])))
def test_mucudnn_backend_values(monkeypatch, value):
    monkeypatch.setenv("MUCUDNN_BACKEND", value)
    name = value.strip().lower()
    try:
        be = get_backend(None)
    except MucudnnError as exc:
        if name in available_backends():  # a valid name this machine cannot run (no GPU)
            assert isinstance(exc, MucudnnError)
        else:
            assert str(exc).startswith("MUCUDNN_BACKEND: expected one of"), str(exc)
        return
    assert be.name.startswith(name) if name else be.name in available_backends()


# -- MUCUDNN_WORKSPACE_LIMIT -------------------------------------------------------------------
@given(value=st.one_of(_env_text, _numbers))
def test_mucudnn_workspace_limit_values(value):
    old = os.environ.get("MUCUDNN_WORKSPACE_LIMIT")
    os.environ["MUCUDNN_WORKSPACE_LIMIT"] = value
    try:
        try:
            got = env_workspace_limit()
        except MucudnnError as exc:
            assert str(exc).startswith("MUCUDNN_WORKSPACE_LIMIT"), str(exc)
            assert isinstance(exc, (ValueError, TypeError))
            return
        v = value.strip()
        if not v or v.lower() in ("none", "off", "inf"):
            assert got is None
        else:  # the one byte parser agrees, and the limit is a non-negative int
            assert got == units.parse_bytes(v, "x") and isinstance(got, int) and got >= 0
    finally:
        if old is None:
            os.environ.pop("MUCUDNN_WORKSPACE_LIMIT", None)
        else:
            os.environ["MUCUDNN_WORKSPACE_LIMIT"] = old


# -- MUCUDNN_TORCH_NATIVE -----------------------------------------------------------------------
@given(value=st.one_of(_env_text, st.sampled_from(["0", " OFF", "False", "no", "1", "on"])))
def test_mucudnn_torch_native_values(value):
    settings = pytest.importorskip("mucudnn.torch.settings")
    old = os.environ.get("MUCUDNN_TORCH_NATIVE")
    os.environ["MUCUDNN_TORCH_NATIVE"] = value
    try:
        assert settings.enabled() is (value.strip().lower() not in ("0", "off", "false", "no"))
    finally:
        if old is None:
            os.environ.pop("MUCUDNN_TORCH_NATIVE", None)
        else:
            os.environ["MUCUDNN_TORCH_NATIVE"] = old


# -- MUCUDNN_CUDNN_LIBRARY (in a forked child) -------------------------------------------------
def _find_in_child(value: str) -> tuple[str, object]:
    """loader.find_library() with MUCUDNN_CUDNN_LIBRARY=value in a forked child:
    ("loaded", (path, version)), ("error", (type name, message, is MucudnnError))
    or ("died", signal/exit status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        try:
            os.close(r)
            os.environ["MUCUDNN_CUDNN_LIBRARY"] = value
            from mucudnn._cudnn import loader
            try:
                found = loader.find_library()
                out: tuple = ("loaded", (found.path, found.version))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = ("error", (type(exc).__name__, str(exc), isinstance(exc, MucudnnError)))
            os.write(w, pickle.dumps(out))
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return "died", status
    return pickle.loads(b"".join(chunks))


@pytest.fixture
def libraries(sandbox):
    """Real-library places when libcudnn is installed: a link to it, a lone copy, a
    link to the copy, its sub-library; else none."""
    if not HAVE_CUDNN:
        return []
    from mucudnn._cudnn import loader
    real = loader.library_path()
    lib = sandbox / "lib"
    lib.mkdir()
    (lib / "link.so.9").symlink_to(real)
    shutil.copyfile(real, lib / "libcudnn.so.9")
    (lib / "to-copy.so.9").symlink_to(lib / "libcudnn.so.9")
    sub = os.path.join(os.path.dirname(real), "libcudnn_graph.so.9")
    return [str(lib / "link.so.9"), str(lib / "libcudnn.so.9"), str(lib / "to-copy.so.9"),
            sub, real]


@pytest.mark.slow
@FIXTURES_OK
@given(data=st.data())
def test_mucudnn_cudnn_library_values_never_abort(sandbox, libraries, data):
    value = data.draw(st.one_of(_hostile(sandbox), st.sampled_from(libraries or [""])),
                      "MUCUDNN_CUDNN_LIBRARY")
    kind, detail = _find_in_child(value)
    assert kind != "died", f"MUCUDNN_CUDNN_LIBRARY={value!r} killed the process ({detail})"
    if kind == "error":
        name, message, ours = detail
        assert ours, f"{name}: {message}"
        if value:
            assert "MUCUDNN_CUDNN_LIBRARY" in message and repr(value) in message, message
        return
    path, version = detail
    assert 90000 <= version < 100000
    if value:  # the variable is the only place: what loaded is the file it names
        assert os.path.realpath(path) == os.path.realpath(os.path.expanduser(value))
