"""scripts/sass_ranges.py (per-phase instruction counts of a SASS listing) on a small listing."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import sass_ranges  # noqa: E402

LISTING = """
        code for sm_90a
                Function : _Z5firstv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FMUL R2, R3, R4 ;
                Function : _Z6secondv
        /*0000*/                   FFMA R2, R3, R4, R5 ;
        /*0010*/              @!P0 FMUL R2, R2, R4 ;
        /*0020*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R120, gdesc[UR16], RZ, !UPT ;
        /*0030*/                   BRA 0x0 ;
"""


def test_counts_a_functions_ranges_by_opcode(tmp_path, capsys):
    path = tmp_path / "k.sass"
    path.write_text(LISTING)
    assert sass_ranges.main([str(path), "--function", "second", "0-20", "20-40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("0-20: 2  ") and "FFMA 1" in out[0] and "FMUL 1" in out[0]
    assert out[1].startswith("20-40: 2  ") and "QGMMA 1" in out[1] and "BRA 1" in out[1]
    assert out[2].startswith("total 4: ")


def test_refuses_a_missing_function_and_a_malformed_range(tmp_path):
    path = tmp_path / "k.sass"
    path.write_text(LISTING)
    with pytest.raises(SystemExit, match="no instructions"):
        sass_ranges.main([str(path), "--function", "third", "0-10"])
    with pytest.raises(SystemExit, match="START-END"):
        sass_ranges.main([str(path), "0x10"])
