"""bench/kernel_cycles.py's reading of Nsight Compute CSV logs, on synthetic logs: no GPU needed."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import kernel_cycles as K  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def log(kernels):
    """An ncu --csv log of (name, cycles) launches in order, each with a duration row too."""
    lines = ["==PROF== Connected to process 1 (python3)\n", HEADER]
    for i, (name, cycles) in enumerate(kernels):
        for metric, unit, value in (("gpu__time_duration.sum", "ns", "1,000"), (K.CYCLES, "cycle", f"{cycles:,}")):
            lines.append(f'"{i}","1","python3","h","{name}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
                         f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')
    return "".join(lines)


FLAMIA_CALL = [("void flamia::quantize_mxfp8_kernel<1, 2, 0>(...)", 100_000),
               ("void flamia::quantize_mxfp8_kernel<1, 2, 0>(...)", 100_000),
               ("void flamia::quantize_mxfp8_kernel<1, 2, 0>(...)", 130_000),
               ("flamia::prefix_max_scales_kernel(...)", 20_000),
               ("flamia::build_work_order_kernel(flamia::BuildArgs)", 8_000),
               ("void sm90::forward_kernel<128, 1, 0>(sm90::ForwardArgs)", 9_000_000)]


def test_a_call_is_its_kernels_per_attention_launch_without_the_set_up():
    setup = [("void at::distribution_elementwise_grid_stride_kernel<float, 4>(...)", 600_000),
             ("void dot_kernel<float, 128, 0>(...)", 350_000)]
    fams, calls = K.per_call(K.launches(log(setup + FLAMIA_CALL + FLAMIA_CALL)))
    assert calls == 2
    assert fams == {"quantize": 330_000, "V fold reference": 20_000, "work order": 8_000, "forward kernel": 9_000_000}


def test_jax_calls_count_their_small_kernels_and_not_the_fp8_conversion():
    call = [("loop_select_fusion", 4_000), ("input_scatter_fusion", 3_000),
            ("cudnn::qkv_tma_setup(unsigned int)", 6_000),
            ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128", 760_000)]
    fams, calls = K.per_call(K.launches(log([("wrapped_convert", 165_000)] + call * 3)))
    assert calls == 3
    assert fams == {"XLA": 7_000, "cuDNN setup": 6_000, "cuDNN attention": 760_000}


def test_the_table_lists_the_families_seen_in_thousands(tmp_path):
    (tmp_path / "4x16384__flamia.csv").write_text(log(FLAMIA_CALL))
    (tmp_path / "tiny__jax-cudnn-fp8.csv").write_text(log([("void at::copy_kernel(...)", 1_000)]))
    text = K.parse([tmp_path / "4x16384__flamia.csv", tmp_path / "tiny__jax-cudnn-fp8.csv"])
    lines = text.splitlines()
    assert lines[0] == "| call | calls | quantize | V fold reference | work order | forward kernel | sum |"
    assert lines[2] == "| 4x16384__flamia | 1 | 330.0 | 20.0 | 8.0 | 9,000.0 | 9,358.0 |"
    assert lines[3].startswith("- tiny__jax-cudnn-fp8: no attention kernel")


def test_a_log_without_an_attention_kernel_is_refused():
    with pytest.raises(ValueError, match="no attention kernel"):
        K.per_call(K.launches(log(FLAMIA_CALL[:3])))


def details_log(kernels):
    """An ncu --csv --page details log: (name, {metric: value}) per profiled kernel."""
    lines = [HEADER]
    for i, (name, metrics) in enumerate(kernels):
        for metric, value in metrics.items():
            lines.append(f'"{i}","1","python3","h","{name}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
                         f'"SpeedOfLight","{metric}","","{value}"\n')
    return "".join(lines)


def test_the_sections_table_has_a_column_per_kernel_and_a_dash_for_a_missing_metric(tmp_path):
    path = tmp_path / "4x16384.sections.csv"
    path.write_text(details_log([
        ("void sm90::forward_kernel<128, 1, 0>(sm90::ForwardArgs)", {"Elapsed Cycles": "9,295,826", "Executed Ipc Active": "1.95"}),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f8_knob_32", {"Elapsed Cycles": "7,872,616"}),
    ]))
    lines = K.sections_table([path]).splitlines()
    assert lines[0] == ("| | 4x16384.sections: flamia forward kernel | "
                        "4x16384.sections: cudnn_generated_fort_native_sdpa_sm90_fl |")
    assert lines[2] == "| elapsed SM cycles | 9,295,826 | 7,872,616 |"
    assert lines[4] == "| IPC (active) | 1.95 | - |"


def raw_log(kernels):
    """An ncu --csv --page raw log: a header of metric names, a row of units, a row per kernel."""
    metrics = sorted({m for _, values in kernels for m in values})
    header = ["ID", "Kernel Name", *metrics]
    lines = ["==PROF== Connected to process 1 (python3)\n", ",".join(f'"{h}"' for h in header) + "\n",
             ",".join('""' if h in ("ID", "Kernel Name") else '"ratio"' for h in header) + "\n"]
    for i, (name, values) in enumerate(kernels):
        lines.append(",".join(f'"{v}"' for v in [str(i), name, *(values.get(m, "") for m in metrics)]) + "\n")
    return "".join(lines)


def test_the_stalls_table_reads_raw_metrics_per_kernel_under_their_labels(tmp_path):
    wait = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
    xu = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
    (tmp_path / "a.stalls.csv").write_text(raw_log([("forward_kernel", {wait: "1.64", xu: "46.22"})]))
    (tmp_path / "b.stalls.csv").write_text(raw_log([("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", {wait: "0.67"})]))
    assert K.raw_metrics((tmp_path / "a.stalls.csv").read_text())[0][1][wait] == "1.64"
    lines = K.stalls_table([tmp_path / "a.stalls.csv", tmp_path / "b.stalls.csv"]).splitlines()
    assert lines[0] == "| | a.stalls: flamia forward kernel | b.stalls: cudnn_generated_fort_native_sdpa_sm90_fl |"
    assert lines[2] == "| stall wait, warps per issue | 1.64 | 0.67 |"
    assert "| MUFU (XU) pipe busy, % | 46.22 | - |" in lines
    assert len(lines) == 2 + len(K.STALL_ROWS)


def test_a_kernel_without_a_value_in_a_shared_raw_log_shows_a_dash(tmp_path):
    wait = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
    xu = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
    (tmp_path / "both.csv").write_text(raw_log([("forward_kernel", {wait: "1.64", xu: "46.22"}),
                                               ("cudnn_generated_fort_native_sdpa", {wait: "0.67"})]))
    assert "| MUFU (XU) pipe busy, % | 46.22 | - |" in K.stalls_table([tmp_path / "both.csv"]).splitlines()
