"""The Python package installs into a fresh virtual environment by README's commands: the pinned
build requirements (requirements-build.txt) and a build without pip's isolation, or an isolated
`pip install .` that fetches the build backend itself. Both build here with the CUDA kernels off
(`-C cmake.define.FLAMIA_CUDA=OFF`: no CUDA toolkit needed, and the package then holds the Python
modules without libflamia_capi.so) and with `--no-deps` (PyTorch, the run-time dependency, is not
downloaded). They need PyPI and about a minute on 2 cores, so they run only where
FLAMIA_INSTALL_TEST=1 (CI sets it)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.markers import Marker  # packaging comes with pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.environ.get("FLAMIA_INSTALL_TEST") != "1",
                                reason="installs from PyPI into a fresh venv: set FLAMIA_INSTALL_TEST=1")

CPU_ONLY = ["-C", "cmake.define.FLAMIA_CUDA=OFF"]


def clean_environment():
    """This process's environment without what would point the fresh venv's Python elsewhere."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "FLAMIA_CAPI_LIB", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(name, None)
    return env


def run(args, cwd):
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=clean_environment(), capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return result.stdout + result.stderr


def fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    return venv / "bin" / "python"


def pins():
    """requirements-build.txt's pins that apply to this Python: {name: version}."""
    found = {}
    for line in (REPO / "requirements-build.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, _, marker = line.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        name, version = requirement.strip().split("==")
        found[canonical(name)] = version
    return found


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python, cwd):
    listing = json.loads(run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], cwd))
    return {canonical(p["name"]): p["version"] for p in listing}


def check_installed_package(python, tmp_path):
    """The package imports from the venv (not from the source tree) with the source's version,
    modules and run-time requirement, and without PyTorch says so when called."""
    probe = (
        "import importlib.metadata as m, json, pathlib, flamia, flamia._capi as capi\n"
        "try:\n"
        "    flamia.attention()\n"
        "    message = None\n"
        "except ImportError as e:\n"
        "    message = str(e)\n"
        "print(json.dumps({'version': flamia.__version__, 'metadata': m.version('flamia'),\n"
        "                  'file': flamia.__file__, 'requires': m.requires('flamia'),\n"
        "                  'modules': sorted(str(f) for f in m.files('flamia') if str(f).endswith('.py')),\n"
        "                  'library': str(capi.library_path()), 'attention': message}))\n"
    )
    found = json.loads(run([python, "-c", probe], tmp_path).strip().splitlines()[-1])
    version = re.search(r'^__version__ = "([^"]+)"', (REPO / "python/flamia/__init__.py").read_text(), re.M).group(1)
    assert found["version"] == found["metadata"] == version
    package = pathlib.Path(found["file"]).parent
    assert package.is_relative_to(python.parent.parent), f"flamia imported from {package}, not the venv"
    assert found["modules"] == sorted(f"flamia/{p.name}" for p in (REPO / "python/flamia").glob("*.py"))
    dependencies = re.search(r"^dependencies = \[(.*)\]", (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert found["requires"] == json.loads(f"[{dependencies}]") == ["torch>=2.5"]
    assert pathlib.Path(found["library"]) == package / "libflamia_capi.so"  # where a CUDA build puts it
    assert "needs PyTorch" in found["attention"]


def test_pinned_build_requirements_then_a_build_without_isolation(tmp_path):
    python = fresh_venv(tmp_path)
    before = installed(python, tmp_path)
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", REPO / "requirements-build.txt"],
        tmp_path)
    added = {name: v for name, v in installed(python, tmp_path).items() if name not in before}
    assert added == pins(), "requirements-build.txt does not pin every package it installs"

    log = run([python, "-m", "pip", "install", "-v", "--disable-pip-version-check", "--no-build-isolation",
               "--no-deps", *CPU_ONLY, "-C", f"build-dir={tmp_path / 'build'}", REPO], tmp_path)
    # The pinned backend and CMake did the build.
    assert f"scikit-build-core {added['scikit-build-core']} using CMake {added['cmake']} (wheel)" in log
    assert "flamia: CUDA kernels OFF" in log
    check_installed_package(python, tmp_path)


def test_an_isolated_build_fetches_the_backend_itself(tmp_path):
    python = fresh_venv(tmp_path)
    log = run([python, "-m", "pip", "install", "-v", "--disable-pip-version-check", "--no-deps", *CPU_ONLY,
               "-C", f"build-dir={tmp_path / 'build'}", REPO], tmp_path)
    assert re.search(r"scikit-build-core \S+ using CMake \S+ \(wheel\)", log)
    assert "scikit-build-core" not in installed(python, tmp_path)  # it lived in the build's own environment
    check_installed_package(python, tmp_path)
