"""bench/bench_attention.py's guards, without a GPU: outputs that fail the cosine check are refused
(no time, no ratio), a workload's child process that crashes is reported and the run goes on, and
the FlashAttention-3 baseline's setup imports without JAX and says so when JAX is missing."""
import math
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_attention  # noqa: E402
from attention import impls, isolate, report, timing  # noqa: E402

from bench_rows import META, ok  # noqa: E402


# ---- the cosine check refuses outputs

class Out:
    """A packed output standing in for a tensor: check_output only clones it and hands it to cosine."""

    def __init__(self, name):
        self.name = name

    def clone(self):
        return Out(self.name)


def fake_cosines(monkeypatch, table):
    monkeypatch.setattr(timing, "cosine", lambda torch, a, b: table[(a.name, b.name)])


def test_outputs_below_the_cosine_bar_or_nan_are_refused_and_keep_their_time_apart(monkeypatch):
    fake_cosines(monkeypatch, {("fa3", "flamia"): 0.9995, ("fp8", "flamia"): 0.2512, ("nan", "flamia"): math.nan})
    case = types.SimpleNamespace(reference_o=None, reference_impl=None)
    flamia = timing.check_output(None, case, "flamia", Out("flamia"), ok(2.0, 600.0))
    assert flamia["status"] == "ok" and case.reference_impl == "flamia" and "cos" not in flamia
    fa3 = timing.check_output(None, case, "jax-fa3", Out("fa3"), ok(2.2, 550.0))
    assert fa3["status"] == "ok" and fa3["cos_vs_flamia"] == 0.9995 and fa3["ms"] == 2.2
    fp8 = timing.check_output(None, case, "jax-cudnn-fp8", Out("fp8"), ok(1.5, 800.0))
    assert fp8["status"] == "wrong outputs (cos 0.2512)"
    assert "ms" not in fp8 and "tflops" not in fp8 and fp8["refused_ms"] == 1.5 and fp8["refused_tflops"] == 800.0
    nan = timing.check_output(None, case, "flex", Out("nan"), ok(1.0, 900.0))
    assert nan["status"] == "wrong outputs (cos nan)"  # NaN is below every bar
    unreadable = timing.check_output(None, case, "fa2-varlen", RuntimeError("dlpack"), ok(1.0, 900.0))
    assert unreadable["status"].startswith("wrong outputs (unreadable: RuntimeError: dlpack")


def test_without_flamias_output_the_first_output_read_back_is_the_reference(monkeypatch):
    fake_cosines(monkeypatch, {("sdpa", "fa3"): 0.5})
    case = types.SimpleNamespace(reference_o=None, reference_impl=None)
    fa3 = timing.check_output(None, case, "jax-fa3", Out("fa3"), ok(2.2, 550.0))
    assert fa3["reference"] is True and case.reference_impl == "jax-fa3"
    sdpa = timing.check_output(None, case, "cudnn-sdpa", Out("sdpa"), ok(2.4, 500.0))
    assert sdpa["status"] == "wrong outputs (cos 0.5000)" and sdpa["cos_reference"] == "jax-fa3"
    assert "cos_vs_flamia" not in sdpa


def test_the_report_shows_refused_and_crashed_cells_without_a_time_and_leaves_them_out_of_the_ratios():
    r = {"workload": "16x4096", "docs": 16, "impls": {
        "flamia": ok(2.0, 600.0),
        "jax-fa3": {"status": "crashed (signal 11)"},
        "cudnn-sdpa": ok(2.5, 480.0),
        "fa2-varlen": {"status": "wrong outputs (cos 0.3130)", "refused_ms": 1.0, "refused_tflops": 1200.0,
                       "note": "its output's cosine to flamia's is 0.3130 (below 0.99)"},
        "jax-cudnn-fp8": {"status": "wrong outputs (cos 0.2471)", "refused_ms": 0.5, "refused_tflops": 2400.0}}}
    report.summarize(r)
    assert r["best_bf16"] == "cudnn-sdpa" and r["ratio_vs_best_bf16"] == pytest.approx(1.25)
    assert r["ratio_vs_fa3"] is None and r["ratio_vs_cudnn_fp8"] is None
    names = list(r["impls"])
    table = report.markdown(META, [r], names)
    line = next(l for l in table.splitlines() if l.startswith("| 16x4096"))
    assert ("| 2.000 / 600 | crashed (signal 11) | 2.500 / 480 | wrong outputs (cos 0.3130) | "
            "wrong outputs (cos 0.2471) | - | 1.25 (cudnn-sdpa) | - |") in line
    assert "1.000" not in line and "0.500" not in line
    assert "| flamia / FA3 | flamia / best BF16 |" in table
    assert "16x4096 / fa2-varlen: its output's cosine to flamia's is 0.3130" in table


def test_fa3_is_the_baseline_to_beat_and_in_the_default_list():
    r = {"workload": "16x4096", "docs": 16, "impls": {"flamia": ok(2.0, 600.0), "jax-fa3": ok(2.4, 500.0),
                                                      "cudnn-sdpa": ok(2.2, 545.0)}}
    report.summarize(r)
    assert r["ratio_vs_fa3"] == pytest.approx(1.2) and r["best_bf16"] == "cudnn-sdpa"
    line = next(l for l in report.markdown(META, [r], list(r["impls"])).splitlines() if l.startswith("| 16x4096"))
    assert "| 1.20 | 1.10 (cudnn-sdpa) |" in line
    assert "jax-fa3" in bench_attention.parse_args([]).impl_names
    assert "jax-fa3" in bench_attention.parse_args(["--graph"]).impl_names
    assert "jax-fa3" in impls.JAX_SETUPS and "jax-fa3" in impls.BF16_BASELINES


def test_the_fp8_baseline_takes_no_part_in_the_training_pass():
    case = types.SimpleNamespace(train=True, equal=True)
    with pytest.raises(impls.Unsupported, match="training call"):
        impls.setup_jax_cudnn_fp8(None, None, case)


# ---- FlashAttention-3's setup without JAX

def test_fa3_setup_says_unsupported_without_jax_or_the_wheel(monkeypatch, tmp_path):
    monkeypatch.setattr(impls, "_jax_modules", None)
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    with pytest.raises(impls.Unsupported, match="JAX"):
        impls.setup_jax_fa3(None, None, types.SimpleNamespace())
    monkeypatch.setattr(impls, "CARRIED_SITE", tmp_path / "site")
    monkeypatch.setitem(sys.modules, "flash_attn3_jax", None)
    with pytest.raises(impls.Unsupported, match="flash_attn3_jax is not importable.*prepare_gpu_carry"):
        impls.import_fa3()


def test_fa3_import_looks_in_the_carried_site(monkeypatch, tmp_path):
    site = tmp_path / "site"
    (site / "flash_attn3_jax").mkdir(parents=True)
    (site / "flash_attn3_jax" / "__init__.py").write_text("CARRIED = True\n")
    monkeypatch.setattr(impls, "CARRIED_SITE", site)
    monkeypatch.delitem(sys.modules, "flash_attn3_jax", raising=False)
    # (where the wheel is installed, not that copy)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (pathlib.Path(p or ".") / "flash_attn3_jax").exists()])
    try:
        assert impls.import_fa3().CARRIED is True
        assert sys.path[-1] == str(site)  # after the environment's own packages
    finally:
        sys.modules.pop("flash_attn3_jax", None)


def test_fa3_forward_and_backward_lower_for_cuda_with_the_workloads_shapes():
    """Where JAX and flash-attn3-jax are installed (no GPU needed): the call the bench makes, and its
    jax.vjp, trace and lower for CUDA with GQA's shapes, the backward to FA3's own kernel."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("flash_attn3_jax")
    import jax.numpy as jnp
    fa3 = impls.import_fa3()
    t, hq, hkv, d, cu = 4096, 16, 4, 128, [0, 1000, 4096]

    def f(q, k, v, cu):
        return fa3.flash_mha_varlen(q, k, v, cu, cu, max_seqlen_q=3096, max_seqlen_k=3096,
                                    softmax_scale=d ** -0.5, is_causal=True)

    def train(q, k, v, dout, cu):
        _, vjp = jax.vjp(lambda q, k, v: f(q, k, v, cu), q, k, v)
        return vjp(dout)

    q = jax.ShapeDtypeStruct((t, hq, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((t, hkv, d), jnp.bfloat16)
    cus = jax.ShapeDtypeStruct((len(cu),), jnp.int32)
    grads = jax.eval_shape(train, q, kv, kv, q, cus)
    assert [g.shape for g in grads] == [(t, hq, d), (t, hkv, d), (t, hkv, d)]
    text = jax.jit(train).trace(q, kv, kv, q, cus).lower(lowering_platforms=("cuda",)).as_text()
    assert "flash_mha_fwd" in text and "flash_mha_bwd" in text and "is_causal = true" in text


# ---- a crashing child process

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {bench!r})
    from attention.isolate import Progress
    from attention.timing import run_sequential

    progress = Progress(sys.argv[1])
    progress.set_meta({{"gpu": "fake GPU", "pid": os.getpid()}})

    def run_one(impl):
        if impl == "fa2-varlen":
            os.kill(os.getpid(), signal.SIGSEGV)
        return {{"status": "ok", "ms": 1.0, "tflops": 2.0, "pid": os.getpid()}}

    run_sequential(sys.argv[2].split(","), run_one, progress)
""")


def test_a_child_that_segfaults_is_reported_and_a_new_child_runs_the_rest(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(bench=str(REPO / "bench")))
    launches = []

    def launch(names, progress_path):
        launches.append(names)
        return subprocess.run([sys.executable, str(script), progress_path, ",".join(names)],
                              capture_output=True).returncode

    order = ["flamia", "cudnn-sdpa", "fa2-varlen", "flex", "jax-fa3"]
    results, meta, fatal = isolate.run_isolated(order, launch)
    assert fatal is None and meta["gpu"] == "fake GPU"
    assert launches == [order, ["flex", "jax-fa3"]]
    assert list(results) == order
    assert results["fa2-varlen"] == {"status": f"crashed (signal {int(signal.SIGSEGV)})"}
    for name in ("flamia", "cudnn-sdpa", "flex", "jax-fa3"):
        assert results[name]["status"] == "ok"
    assert results["flamia"]["pid"] == results["cudnn-sdpa"]["pid"] != results["flex"]["pid"]
    assert results["flamia"]["pid"] != os.getpid()


def test_a_crash_outside_the_implementations_ends_the_workload_and_a_fatal_child_ends_the_run():
    def dies_at_start(names, progress_path):
        return -int(signal.SIGABRT)

    results, meta, fatal = isolate.run_isolated(["flamia", "jax-fa3"], dies_at_start)
    assert meta is None and fatal is None
    assert results["jax-fa3"]["status"] == f"crashed (signal {int(signal.SIGABRT)})"
    assert "outside any implementation" in results["jax-fa3"]["note"]

    def reference_crash(names, progress_path):  # flamia's reference output, flamia not asked for
        p = isolate.Progress(progress_path)
        p.start("flamia", "reference output")
        return -int(signal.SIGSEGV)

    results, _, _ = isolate.run_isolated(["jax-fa3"], reference_crash)
    assert "while running flamia (reference output)" in results["jax-fa3"]["note"]

    def no_gpu(names, progress_path):
        isolate.Progress(progress_path).fatal("no CUDA device")
        return 2

    assert isolate.run_isolated(["flamia"], no_gpu)[2] == "no CUDA device"


def test_the_parent_reports_every_workload_when_children_crash(monkeypatch, tmp_path):
    """main() as the parent: a launcher whose child segfaults in jax-fa3 on the first workload; the
    second workload still runs, and the files hold both rows."""
    def fake_launcher(script, argv, workload):
        assert "--json" in argv

        def launch(names, progress_path):
            p = isolate.Progress(progress_path)
            p.set_meta({**META, "gpu": "fake H200"})
            for name in names:
                p.start(name)
                if name == "jax-fa3" and workload == "16x4096":
                    return -int(signal.SIGSEGV)
                p.finish(name, ok(2.0 if name == "flamia" else 2.5, 600.0 if name == "flamia" else 480.0))
            return 0
        return launch

    monkeypatch.setattr(bench_attention, "child_launcher", fake_launcher)
    out = tmp_path / "r.json"
    code = bench_attention.main(["--pass", "train", "--workloads", "16x4096,8x8192", "--impls", "flamia,jax-fa3",
                                 "--json", str(out), "--markdown", str(tmp_path / "r.md")])
    assert code == 0
    import json
    doc = json.loads(out.read_text())
    assert doc["meta"]["complete"] is True and doc["meta"]["gpu"] == "fake H200" and doc["meta"]["isolated"]
    rows = {r["workload"]: r for r in doc["results"]}
    assert rows["16x4096"]["impls"]["jax-fa3"]["status"] == f"crashed (signal {int(signal.SIGSEGV)})"
    assert rows["8x8192"]["impls"]["jax-fa3"]["status"] == "ok"
    assert rows["8x8192"]["ratio_vs_fa3"] == pytest.approx(1.25)
    assert rows["16x4096"]["flops"] == pytest.approx(3.5 * 4 * 128 * 16 * 16 * 4096 * 4097 // 2)
