"""MUCUDNN_CUDNN_LIBRARY is the only candidate when set; cuDNN other than 9.x is
refused, before loading where the file tells (its name, its ELF DT_SONAME), after
loading otherwise (cudnnGetVersion). Fake libraries are compiled with the C
compiler at test time; their constructor appends a line to a marker file, so a
test can tell whether a refused library was ever loaded.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from mucudnn._cudnn import errors, loader
from mucudnn._cudnn.elf import ElfFormatError, read_soname
from mucudnn.errors import MucudnnError

from conftest import needs_cudnn

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to build fake libraries")
MARK_ENV = "MUCUDNN_TEST_CTOR_MARK"

_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
__attribute__((constructor)) static void mucudnn_test_ctor(void) {
    const char *p = getenv("MUCUDNN_TEST_CTOR_MARK");
    if (p) { FILE *f = fopen(p, "a"); if (f) { fputs("constructor ran\n", f); fclose(f); } }
}
#ifdef VERSION
size_t cudnnGetVersion(void) { return VERSION; }
#endif
int mucudnn_fake_symbol(void) { return 42; }
"""


def build(directory: Path, name: str, version: int | None, soname: str | None,
          graph: bool = True) -> Path:
    """A shared library ``directory/name``: cudnnGetVersion() returns ``version``
    (None: no such symbol), DT_SONAME is ``soname`` (None: none); with ``graph``
    a file named libcudnn_graph.so.9 beside it, as in every cuDNN 9 installation
    (Note [cuDNN's sub-libraries] in mucudnn/_cudnn/loader.py)."""
    if graph:
        (directory / loader.REQUIRED_SUB_LIBRARY).write_bytes(b"")
    src = directory / "fake.c"
    src.write_text(_SOURCE)
    out = directory / name
    cmd = [CC, "-shared", "-fPIC", "-o", str(out), str(src)]
    if version is not None:
        cmd.insert(1, f"-DVERSION={version}")
    if soname is not None:
        cmd.append(f"-Wl,-soname,{soname}")
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The file a fake library's constructor writes to when it is loaded."""
    path = tmp_path / "constructor-ran.txt"
    monkeypatch.setenv(MARK_ENV, str(path))
    return path


def hide_other_places(monkeypatch):
    """Make every place but the environment variable fail, so a fall-through
    shows as a different error instead of a silent success."""
    import importlib.metadata

    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(loader, "_distribution", no_dist)
    monkeypatch.setattr(loader, "_find_spec", lambda name: None)
    monkeypatch.setattr(loader, "_import_pathfinder", lambda: None)
    monkeypatch.setattr(loader, "SYSTEM_NAMES", ("libcudnn_mucudnn_missing_test.so.9",))


# -- the variable is the only candidate ---------------------------------------------------------

def test_env_path_that_does_not_exist_raises_naming_variable_and_path(monkeypatch):
    # The wheel's cuDNN is installed: before the fix it loaded silently instead.
    missing = "/nonexistent/mucudnn/libcudnn.so.9"
    monkeypatch.setenv(loader.ENV_VAR, missing)
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    text = str(info.value)
    assert loader.ENV_VAR in text and missing in text and "no such file" in text
    assert [a.source for a in info.value.attempts] == [loader.ENV_VAR]
    assert info.value.attempts[0].outcome == "not found"


def test_env_directory_is_not_a_library(monkeypatch, tmp_path):
    monkeypatch.setenv(loader.ENV_VAR, str(tmp_path))
    with pytest.raises(errors.CudnnLibraryNotFoundError, match="not a file"):
        loader.find_library()


def test_env_non_elf_file_is_refused_before_loading(monkeypatch, tmp_path):
    junk = tmp_path / "libcudnn.so.9"
    junk.write_bytes(b"this is not a shared object")
    monkeypatch.setenv(loader.ENV_VAR, str(junk))
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    assert "not an ELF file" in str(info.value) and str(junk) in str(info.value)
    assert len(info.value.attempts) == 1 and info.value.attempts[0].outcome == "refused"


@needs_cudnn
def test_env_sub_library_of_cudnn_is_refused_by_its_soname(monkeypatch):
    # libcudnn_graph.so.9 exports cudnnGetVersion but is not the library whose
    # functions the prototype table binds.
    graph = Path(loader.library_path()).with_name("libcudnn_graph.so.9")
    if not graph.exists():
        pytest.skip("the loaded cuDNN has no libcudnn_graph.so.9 next to it")
    monkeypatch.setenv(loader.ENV_VAR, str(graph))
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    text = str(info.value)
    assert "libcudnn_graph.so.9" in text and "not the cuDNN library" in text
    assert loader.ENV_VAR in text


@needs_cc
@pytest.mark.parametrize("file_name, soname, version, shown", [
    ("libcudnn.so.8", "libcudnn.so.8", 8907, "cuDNN 8"),      # name and soname say 8
    ("libcudnn.so.10", None, 100000, "cuDNN 10"),             # the file name says 10
    ("libcudnn_custom.so", "libcudnn.so.10", 100000, "cuDNN 10"),  # only the soname tells
    ("libcudnn.so.10.1.0", "libcudnn.so.10", 100100, "cuDNN 10"),
])
def test_env_wrong_major_refused_before_its_constructor_runs(monkeypatch, tmp_path, marker,
                                                              file_name, soname, version, shown):
    lib = build(tmp_path, file_name, version, soname)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnVersionError) as info:
        loader.find_library()
    text = str(info.value)
    assert loader.ENV_VAR in text and str(lib) in text and shown in text
    assert "before loading" in text
    assert not marker.exists(), "the refused library was loaded (its constructor ran)"
    assert isinstance(info.value, MucudnnError) and isinstance(info.value, OSError)


@needs_cc
@pytest.mark.parametrize("version, shown", [(8907, "8.9.7"), (100000, "10.0.0"),
                                            (110203, "11.2.3"), (0, "0.0.0")])
def test_env_wrong_version_seen_only_after_loading_is_refused(monkeypatch, tmp_path, marker,
                                                              version, shown):
    # No soname and a neutral file name: only cudnnGetVersion can tell.
    lib = build(tmp_path, "libmystery.so", version, None)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnVersionError) as info:
        loader.find_library()
    text = str(info.value)
    assert loader.ENV_VAR in text and str(lib) in text and shown in text
    assert "after loading" in text
    assert info.value.version == version
    assert marker.exists()  # documented: a version only the library can tell needs a load


@needs_cc
def test_env_library_without_cudnn_get_version_is_not_cudnn(monkeypatch, tmp_path, marker):
    lib = build(tmp_path, "libnotcudnn.so", None, None)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    text = str(info.value)
    assert "not a cuDNN library" in text and "cudnnGetVersion" in text
    assert loader.ENV_VAR in text and str(lib) in text


@needs_cc
def test_env_library_with_foreign_soname_is_refused_before_loading(monkeypatch, tmp_path,
                                                                   marker):
    lib = build(tmp_path, "libcudnn.so.9", 91900, "libfoo.so.1")
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnLibraryNotFoundError) as info:
        loader.find_library()
    assert "libfoo.so.1" in str(info.value) and "not the cuDNN library" in str(info.value)
    assert not marker.exists()


@needs_cc
@pytest.mark.parametrize("file_name, soname", [("libcudnn.so.9", "libcudnn.so.9"),
                                               ("libcudnn.so.9.19.0", "libcudnn.so.9"),
                                               ("libanything.so", None)])
def test_env_cudnn_9_is_accepted(monkeypatch, tmp_path, marker, file_name, soname):
    lib = build(tmp_path, file_name, 91900, soname)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    found = loader.find_library()
    assert found.source == loader.ENV_VAR and found.version == 91900
    assert Path(found.path) == lib and marker.exists()


@needs_cc
def test_env_relative_name_is_the_file_checked_not_a_search_path_lookup(monkeypatch, tmp_path,
                                                                        marker):
    # A bare name given to dlopen is looked up on the library search path (and
    # would match the wheel's libcudnn.so.9 already loaded); the variable means a file.
    lib = build(tmp_path, "libcudnn.so.9", 91901, "libcudnn.so.9")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(loader.ENV_VAR, "libcudnn.so.9")
    found = loader.find_library()
    assert found.version == 91901 and Path(found.path) == lib


@needs_cc
def test_search_without_env_refuses_cudnn_10_and_says_so(monkeypatch, tmp_path, marker):
    lib = build(tmp_path, "libmystery.so", 100000, None)
    monkeypatch.delenv(loader.ENV_VAR, raising=False)
    hide_other_places(monkeypatch)
    monkeypatch.setattr(loader, "SYSTEM_NAMES", (str(lib),))
    with pytest.raises(errors.CudnnVersionError) as info:
        loader.find_library()
    text = str(info.value)
    assert "10.0.0" in text and "refused" in text and str(lib) in text


@needs_cc
def test_version_errors_pickle_with_their_fields(monkeypatch, tmp_path, marker):
    lib = build(tmp_path, "libmystery.so", 100000, None)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnVersionError) as info:
        loader.find_library()
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)
    assert again.version == 100000 and again.attempts == info.value.attempts


# -- links and lone copies (Note [cuDNN's sub-libraries]) ------------------------------------------

_CHILD = r"""
import sys
from mucudnn._cudnn import loader
from mucudnn.errors import MucudnnError
try:
    found = loader.find_library()
except MucudnnError as exc:
    print("REFUSED", type(exc).__name__, exc)
else:
    print("LOADED", found.version, found.path)
"""


def _load_in_child(value: str) -> subprocess.CompletedProcess:
    """find_library() in a fresh process with MUCUDNN_CUDNN_LIBRARY=value (cuDNN's
    dispatcher aborts the process it runs in when its sub-libraries are missing)."""
    env = {**os.environ, loader.ENV_VAR: value}
    return subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=120)


@needs_cudnn
def test_env_symlink_to_the_real_library_loads_it(tmp_path):
    real = Path(loader.find_library().path)
    link = tmp_path / "libcudnn.so.9"
    link.symlink_to(real)
    out = _load_in_child(str(link))
    assert out.returncode == 0, out.stderr
    kind, version, path = out.stdout.split()
    assert kind == "LOADED" and int(version) == loader.get_version()
    assert Path(path) == real.resolve()


@needs_cudnn
@pytest.mark.parametrize("how", ["copy", "link to a copy", "copy under another name"])
def test_env_lone_copy_is_refused_before_loading(tmp_path, how):
    real = Path(loader.find_library().path)
    copy = tmp_path / ("libmine.so" if how == "copy under another name" else "libcudnn.so.9")
    shutil.copyfile(real, copy)
    target = copy
    if how == "link to a copy":
        target = tmp_path / "elsewhere" / "libcudnn.so.9"
        target.parent.mkdir()
        target.symlink_to(copy)
    out = _load_in_child(str(target))
    assert out.returncode == 0, f"the child died ({out.returncode}): {out.stderr[-500:]}"
    assert out.stdout.startswith("REFUSED CudnnLibraryNotFoundError"), out.stdout
    assert loader.ENV_VAR in out.stdout and loader.REQUIRED_SUB_LIBRARY in out.stdout
    assert str(tmp_path) in out.stdout and "before loading" in out.stdout


@needs_cc
def test_env_fake_without_graph_beside_it_is_refused_before_its_constructor_runs(
        monkeypatch, tmp_path, marker):
    lib = build(tmp_path, "libcudnn.so.9", 91900, "libcudnn.so.9", graph=False)
    monkeypatch.setenv(loader.ENV_VAR, str(lib))
    with pytest.raises(errors.CudnnLibraryError) as info:
        loader.find_library()
    assert loader.REQUIRED_SUB_LIBRARY in str(info.value) and loader.ENV_VAR in str(info.value)
    assert not marker.exists()


# -- the ELF reader -------------------------------------------------------------------------------

def readelf_soname(path: Path) -> str | None:
    """DT_SONAME as binutils' readelf prints it (an independent reader)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"Library soname: \[(.*)\]", out)
    return m.group(1) if m else None


needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")


@needs_cudnn
@needs_readelf
def test_read_soname_agrees_with_readelf_on_the_wheel():
    libdir = Path(loader.library_path()).resolve().parent
    libs = sorted(p for p in libdir.iterdir() if ".so" in p.name)
    assert libs
    for lib in libs:
        assert read_soname(lib) == readelf_soname(lib), lib


@needs_cc
@needs_readelf
@pytest.mark.parametrize("soname", ["libcudnn.so.9", "libx.so", None, "a" * 300])
def test_read_soname_agrees_with_readelf_on_built_libraries(tmp_path, soname):
    lib = build(tmp_path, "libbuilt.so", 91900, soname)
    assert read_soname(lib) == readelf_soname(lib) == soname


@needs_cc
def test_read_soname_never_crashes_on_damaged_files(tmp_path_factory):
    lib = build(tmp_path_factory.mktemp("elf"), "libdamaged.so", 91900, "libcudnn.so.9")
    data = lib.read_bytes()
    work = tmp_path_factory.mktemp("damaged") / "lib.so"

    @settings(max_examples=200, deadline=None)
    @given(cut=st.integers(0, len(data)),
           flips=st.lists(st.tuples(st.integers(0, min(len(data), 4096) - 1),
                                    st.integers(0, 255)), max_size=6))
    def check(cut, flips):
        b = bytearray(data[:cut])
        for i, v in flips:
            if i < len(b):
                b[i] = v
        work.write_bytes(bytes(b))
        try:
            got = read_soname(work)
        except ElfFormatError:
            return
        assert got is None or isinstance(got, str)

    check()


def test_read_soname_reads_big_endian_elf32(tmp_path):
    # A minimal hand-made ELF32 big-endian file: header, two program headers
    # (PT_LOAD mapping vaddr 0x1000 to offset 0, PT_DYNAMIC), dynamic entries, strings.
    ehdr = 52
    phoff, phent = ehdr, 32
    dyn_off = phoff + 2 * phent
    dyn = struct.pack(">iI", 5, 0x1000 + dyn_off + 24)     # DT_STRTAB
    dyn += struct.pack(">iI", 14, 1)                        # DT_SONAME at strtab + 1
    dyn += struct.pack(">iI", 0, 0)                         # DT_NULL
    strings = b"\0libbig.so.3\0"
    total = dyn_off + len(dyn) + len(strings)
    header = b"\x7fELF" + bytes([1, 2, 1]) + bytes(9)
    header += struct.pack(">HHIIIIIHHHHHH", 3, 20, 1, 0, phoff, 0, 0, ehdr, phent, 2, 40, 0, 0)
    load = struct.pack(">IIIIIIII", 1, 0, 0x1000, 0x1000, total, total, 5, 0x1000)
    dynamic = struct.pack(">IIIIIIII", 2, dyn_off, 0x1000 + dyn_off, 0x1000 + dyn_off,
                          len(dyn), len(dyn), 6, 4)
    path = tmp_path / "libbig.so.3"
    path.write_bytes(header + load + dynamic + dyn + strings)
    assert read_soname(path) == "libbig.so.3"


# -- one cuDNN beside torch's ----------------------------------------------------------------------

_BESIDE_TORCH = r"""
import json, os, re
import torch
x = torch.randn(2, 3, 8, 8, device="cuda")
torch.nn.functional.conv2d(x, torch.randn(4, 3, 3, 3, device="cuda"))  # torch loads its cuDNN
torch.cuda.synchronize()
from mucudnn._cudnn import loader
path = loader.library_path()
maps = {}
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6 and re.match(r"libcudnn\w*\.so", os.path.basename(parts[5].strip())):
            p = os.path.realpath(parts[5].strip())
            maps.setdefault(os.path.basename(p).split(".so")[0], set()).add(p)
print(json.dumps({"mucudnn": os.path.realpath(path), "version": loader.get_version(),
                  "torch_version": torch.backends.cudnn.version(),
                  "maps": {k: sorted(v) for k, v in maps.items()}}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_beside_torch_the_process_maps_one_cudnn_and_mucudnn_uses_it():
    """By default (no MUCUDNN_CUDNN_LIBRARY) mucudnn finds the cuDNN that torch
    loaded: after a torch convolution and mucudnn's load, each cuDNN library
    is mapped from one file, libcudnn's is the file mucudnn loaded, and the
    versions agree (a second copy would be a second cuDNN state and load)."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != loader.ENV_VAR}
    r = subprocess.run([sys.executable, "-c", _BESIDE_TORCH], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["maps"].get("libcudnn") == [got["mucudnn"]], got
    assert all(len(paths) == 1 for paths in got["maps"].values()), got["maps"]
    assert got["version"] == got["torch_version"]
