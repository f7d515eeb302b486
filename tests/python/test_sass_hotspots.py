"""scripts/sass_hotspots.py (the summary of scripts/profile_gpu.sh --sass) on a small export in
Nsight Compute's source-page CSV form: kernel line, header, one row per SASS instruction."""
import csv
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import sass_hotspots  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_wait", "stall_barrier", "stall_selected", "stall_wait (Not Issued)"]
ROWS = [  # address, source, samples, executed, wait, barrier, selected, (not issued: ignored)
    ["0x10", "      FFMA R1, R2, R3, R4", "30", "300", "20", "0", "10", "99"],
    ["0x20", "@!P0  FFMA R5, R6, R7, R8", "10", "100", "5", "0", "5", "99"],
    ["0x30", "      WARPGROUP.DEPBAR.LE gsb0, 0x0", "60", "100", "0", "60", "0", "99"],
]


def export(tmp_path, rows=ROWS):
    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "void k<128>(Args)", ""])
        w.writerow(HEADER)
        w.writerows(rows)
    return path


def test_reasons_opcodes_and_top_instructions(tmp_path, capsys):
    sass_hotspots.main([str(export(tmp_path)), "--top", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "stall samples: 100"  # 20 + 5 + 60 + 10 + 5: the "(Not Issued)" column is not a reason
    reasons = {line.split()[0]: line.split()[1] for line in out[1:4]}
    assert reasons == {"barrier": "60.0%", "wait": "25.0%", "selected": "15.0%"}
    ffma = next(line for line in out if line.strip().startswith("FFMA"))
    assert ffma.split()[1:3] == ["80.0%", "executed"]  # predicated FFMA counts as FFMA: 400 of 500
    assert "40.0% of samples" in ffma
    groups = out[out.index("--- stall samples by runs per instruction (the 8 largest groups)") + 1:
                 out.index("--- top 2 instructions by stall samples")]
    # 0x20 and the DEPBAR ran 100 times each (10 + 60 samples), 0x10 300 times (30).
    assert [line.split() for line in groups] == [["100", "runs", "2", "instructions", "70.0%", "of", "samples"],
                                                 ["300", "runs", "1", "instructions", "30.0%", "of", "samples"]]
    top = out[out.index("--- top 2 instructions by stall samples") + 1:]
    assert len(top) == 2 and "WARPGROUP.DEPBAR" in top[0] and "barrier:60" in top[0]
    assert top[1].split()[0] == "0x10"


def test_an_export_without_the_source_table_is_refused(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text('"Kernel Name","k"\n')
    with pytest.raises(SystemExit, match="no SASS source table"):
        sass_hotspots.main([str(path)])
