"""bench/bench_attention.py's arguments and report (its timings need torch and a GPU; these parts
do not): --graph, the ratios per row, what the table says about how each cell was timed, the
interleaved schedule's turns, and what a captured call keeps alive."""
import contextlib
import gc
import pathlib
import sys
import weakref

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_attention  # noqa: E402
from attention import timing  # noqa: E402

from bench_rows import META, ok  # noqa: E402


def row(impls):
    return {"workload": "16x4096", "docs": 16, "impls": impls}


def test_graph_mode_drops_flamia_graph_from_all_but_keeps_it_when_asked_for():
    assert "flamia-graph" not in bench_attention.parse_args(["--graph"]).impl_names
    assert "flamia-graph" in bench_attention.parse_args([]).impl_names
    assert bench_attention.parse_args(["--graph", "--impls", "flamia,flamia-graph"]).impl_names == [
        "flamia", "flamia-graph"]


def test_ratios_take_the_fastest_bf16_baseline_whose_output_agrees():
    r = row({"flamia": ok(2.0, 600.0), "flamia-prefix": ok(2.2, 545.0), "cudnn-sdpa": ok(2.4, 500.0),
             "fa2-varlen": ok(1.5, 800.0, warning="output differs"), "jax-cudnn-fp8": ok(1.7, 700.0)})
    bench_attention.summarize(r)
    assert r["best_bf16"] == "cudnn-sdpa"  # fa2-varlen is faster but computes something else
    assert abs(r["ratio_vs_best_bf16"] - 1.2) < 1e-12
    assert abs(r["ratio_vs_cudnn_fp8"] - 600 / 700) < 1e-12
    assert abs(r["prefix_time_ratio"] - 600 / 545) < 1e-12


def test_the_table_says_which_cells_were_timed_eager_under_graph():
    r = row({"flamia": ok(2.0, 600.0, graph=True),
             "cudnn-sdpa": ok(2.4, 500.0, graph=False, note="timed eager: CUDA graph capture failed twice (x)")})
    bench_attention.summarize(r)
    table = bench_attention.markdown({**META, "graph": True}, [r], ["flamia", "cudnn-sdpa"])
    assert "replaying its call from a CUDA graph" in table
    line = next(l for l in table.splitlines() if l.startswith("| 16x4096"))
    assert "2.000 / 600 |" in line and "2.400 / 500 (eager)" in line
    assert "16x4096 / cudnn-sdpa: timed eager: CUDA graph capture failed twice (x)" in table
    eager = bench_attention.markdown({**META, "graph": False}, [r], ["flamia", "cudnn-sdpa"])
    assert "Eager calls (host time included)" in eager


class FakeTorch:
    """What run_interleaved needs of torch when the implementations are fakes."""

    class cuda:
        @staticmethod
        def synchronize():
            pass

        @staticmethod
        def empty_cache():
            pass


def test_interleaved_schedule_times_each_implementation_once_per_round_in_rotated_turns(monkeypatch):
    calls = []

    def fake_prepare(torch, flamia, case, impl, args):
        if impl == "flex":
            return {"status": "unsupported: no block mask"}

        def once(during=None):
            calls.append(impl)
            if impl == "fa2-varlen" and calls.count(impl) == 2:
                raise RuntimeError("boom")
            return float(len(calls)), None  # "ms": the call's position in the whole schedule

        return bench_attention.Prepared(impl, once, lambda out: out, {"status": "ok"})

    monkeypatch.setattr(timing, "prepare", fake_prepare)
    assert bench_attention.parse_args([]).schedule == "sequential"  # the default
    args = bench_attention.parse_args(["--rounds", "3", "--no-check", "--schedule", "interleaved"])
    case = type("Case", (), {"flops": 1e12})()
    order = ["flamia", "cudnn-sdpa", "fa2-varlen", "flex"]
    results = bench_attention.run_interleaved(FakeTorch, None, case, order, args)
    # Round 0 starts at the first, round 1 at the second; fa2-varlen fails in round 1 and leaves the turns.
    assert calls == ["flamia", "cudnn-sdpa", "fa2-varlen", "cudnn-sdpa", "fa2-varlen", "flamia",
                     "flamia", "cudnn-sdpa"]
    assert list(results) == order
    assert results["flamia"]["times_ms"] == [1.0, 6.0, 7.0] and results["flamia"]["ms"] == 6.0
    assert results["cudnn-sdpa"]["times_ms"] == [2.0, 4.0, 8.0]
    assert results["fa2-varlen"]["status"] == "unsupported: RuntimeError: boom"
    assert results["flex"]["status"] == "unsupported: no block mask"


def test_the_table_says_how_the_rounds_were_scheduled():
    r = row({"flamia": ok(2.0, 600.0)})
    bench_attention.summarize(r)
    assert "timed in turns" in bench_attention.markdown({**META, "schedule": "interleaved"}, [r], ["flamia"])
    assert "rounds back to back" in bench_attention.markdown({**META, "schedule": "sequential"}, [r], ["flamia"])


class FakeGraphTorch:
    """What captured() needs of torch, the graph a no-op: enough to see what the replaying fn holds."""

    class cuda:
        class Stream:
            def wait_stream(self, other):
                pass

            def synchronize(self):
                pass

        class CUDAGraph:
            def replay(self):
                pass

        @staticmethod
        def current_stream():
            return FakeGraphTorch.cuda.Stream()

        @staticmethod
        def stream(s):
            return contextlib.nullcontext()

        @staticmethod
        def graph(g, stream=None):
            return contextlib.nullcontext()


def test_a_captured_call_outlives_its_eager_call_and_what_that_closure_holds():
    # A fault of the interleaved schedule: FlexAttention's graph was replayed after its eager closure (the
    # only holder of its block mask) had been dropped and torch.cuda.empty_cache() had run.
    class Tensor:  # stands in for a tensor only the eager call's closure holds
        pass

    def make_call():
        block_mask = Tensor()

        def call():
            assert block_mask is not None  # the call reads it; its output is another tensor
            return Tensor()
        return call, weakref.ref(block_mask)

    call, held = make_call()
    fn = bench_attention.captured(FakeGraphTorch, call, warmup=1)
    del call
    gc.collect()
    assert held() is not None and isinstance(fn(), Tensor)
    del fn
    gc.collect()
    assert held() is None  # held by the graph's fn, not leaked


def test_the_table_says_how_rounds_were_timed_and_bad_counts_are_refused():
    r = row({"flamia": ok(2.0, 600.0)})
    bench_attention.summarize(r)
    args = bench_attention.parse_args(["--graph"])
    assert args.calls_per_round == bench_attention.CALLS_PER_ROUND > 1  # GPU time, not the host's launch
    table = bench_attention.markdown({**META, "graph": True, "calls_per_round": 4}, [r], ["flamia"])
    assert "; each round times 4 calls dispatched back to back, per call." in table
    assert "JAX's calls are jitted)" in table
    eager = bench_attention.markdown({**META, "graph": False, "calls_per_round": 4}, [r], ["flamia"])
    assert "Eager calls (host time counts where it exceeds the GPU's)" in eager
    one = bench_attention.markdown({**META, "graph": False, "calls_per_round": 1}, [r], ["flamia"])
    assert "; each round times one call." in one and "Eager calls (host time included)" in one
    # An older JSON: only JAX's calls back to back (jax_calls); older still: one call of each.
    s34 = bench_attention.markdown({**META, "graph": True, "jax_calls": 4}, [r], ["flamia"])
    assert "JAX's calls are jitted, timed 4 back to back, per call" in s34 and "each round times" not in s34
    old = bench_attention.markdown({**META, "graph": True}, [r], ["flamia"])
    assert "each timed to its own block_until_ready" in old
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--calls-per-round", "0"])


def test_a_round_times_its_calls_back_to_back_per_call():
    class FakeEvent:
        clock = [0.0]

        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            self.t = FakeEvent.clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    class FakeTorch:
        class cuda:
            Event = FakeEvent

    def call():  # each call takes 2 ms of "GPU time"
        FakeEvent.clock[0] += 2.0
        return "out"

    ms, out = bench_attention.torch_once(FakeTorch, call, 4)()
    assert (ms, out) == (2.0, "out") and FakeEvent.clock[0] == 8.0

def test_outputs_are_written_after_every_workload_and_say_when_partial(tmp_path):
    args = bench_attention.parse_args(["--workloads", "16x4096,8x8192", "--json", str(tmp_path / "r.json"),
                                       "--markdown", str(tmp_path / "r.md")])
    first = row({"flamia": ok(2.0, 600.0)})
    bench_attention.summarize(first)
    bench_attention.write_outputs(args, dict(META), [first], complete=False)
    import json
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["complete"] is False and [r["workload"] for r in doc["results"]] == ["16x4096"]
    assert "Partial: 1 of 2 workloads" in (tmp_path / "r.md").read_text()
    second = {**row({"flamia": ok(4.0, 600.0)}), "workload": "8x8192"}
    bench_attention.summarize(second)
    table = bench_attention.write_outputs(args, dict(META), [first, second], complete=True)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["complete"] is True and len(doc["results"]) == 2
    assert "Partial" not in table and (tmp_path / "r.md").read_text() == table
