"""One version and one ABI number across the project's files, and the Python bindings' refusal of a
C API library built from other headers (a ctypes mirror handed a mismatched library would pass it
structs it misreads)."""
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from flamia import _capi  # noqa: E402


def found(pattern, path):
    m = re.search(pattern, (REPO / path).read_text(), re.M)
    assert m, f"no match for {pattern!r} in {path}"
    return m.group(1)


def test_the_version_has_one_home_the_package_which_cmake_and_pyproject_read():
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", found(r'^__version__ = "([^"]*)"', "python/flamia/__init__.py"))
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "project(flamia VERSION ${FLAMIA_VERSION}" in cmake
    assert re.search(r'file\(STRINGS "\$\{CMAKE_CURRENT_SOURCE_DIR\}/python/flamia/__init__.py" FLAMIA_VERSION_LINE', cmake)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=", pyproject, re.M), "pyproject.toml states a version of its own"
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert found(r"^\[tool\.scikit-build\.metadata\.version\]\nprovider = \"([^\"]+)\"", "pyproject.toml") == \
        "scikit_build_core.metadata.regex"
    assert found(r'^\[tool\.scikit-build\.metadata\.version\]\n.*\ninput = "([^"]+)"', "pyproject.toml") == \
        "python/flamia/__init__.py"


def test_the_bindings_mirror_the_headers_abi():
    assert int(found(r"^#define FLAMIA_ABI_VERSION (\d+)", "include/flamia/flamia.h")) == _capi.ABI_VERSION


class FakeLibrary:
    """ctypes.CDLL's stand-in: a library whose flamia_abi_version returns `abi` (None: no such symbol)."""

    def __init__(self, abi):
        if abi is not None:
            def flamia_abi_version():
                return abi
            self.flamia_abi_version = flamia_abi_version


@pytest.mark.parametrize("abi, message", [
    (_capi.ABI_VERSION + 1, f"has ABI {_capi.ABI_VERSION + 1}, these bindings need ABI {_capi.ABI_VERSION}"),
    (None, "has no flamia_abi_version"),
])
def test_a_library_with_another_abi_is_refused_at_load(tmp_path, monkeypatch, abi, message):
    path = tmp_path / "libflamia_capi.so"
    path.write_bytes(b"")
    monkeypatch.setenv(_capi.ENV_LIBRARY, str(path))
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setattr(_capi.ctypes, "CDLL", lambda name: FakeLibrary(abi))
    with pytest.raises(RuntimeError, match=re.escape(message)) as info:
        _capi.library()
    assert str(path) in str(info.value)
    assert _capi._lib is None  # nothing half-loaded is kept
