"""scripts/gpu_ab.sh's parts that need no GPU: the base sources it prepares from a commit, and its
refusals (a run without prepared sources, unknown arguments)."""
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_ab.sh"


def ab(*args, base, **kw):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin:/usr/local/bin", "AB_BASE": str(base)}, **kw)


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git checkout")
def test_prepare_puts_the_commits_sources_and_its_hash(tmp_path):
    base = tmp_path / "base"
    r = ab("prepare", "HEAD", base=base)
    assert r.returncode == 0, r.stderr
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert (base / ".ab-commit").read_text().strip() == head
    assert (base / "CMakeLists.txt").read_bytes() == subprocess.run(
        ["git", "-C", str(REPO), "show", "HEAD:CMakeLists.txt"], capture_output=True).stdout
    assert f"carry {base}" in r.stdout


def test_prepare_refuses_an_unknown_commit(tmp_path):
    r = ab("prepare", "no-such-ref-anywhere", base=tmp_path / "base")
    assert r.returncode == 2 and "no commit no-such-ref-anywhere" in r.stderr


def test_run_refuses_without_prepared_sources_and_unknown_arguments(tmp_path):
    r = ab("run", base=tmp_path / "missing")
    assert r.returncode == 2 and "run 'scripts/gpu_ab.sh prepare REF' where git is" in r.stderr
    r = ab("run", "--rounds", "3", "--bogus", base=tmp_path / "missing")
    assert r.returncode == 2 and "unknown argument --bogus" in r.stderr
    r = ab("measure", base=tmp_path / "missing")
    assert r.returncode == 2 and "gpu_ab.sh prepare [REF]" in r.stderr
