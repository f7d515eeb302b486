"""The leak experiment's CPU-side pieces: packing rows into arrays (train.py) and the report table."""
import json
import pathlib
import struct
import sys

import numpy as np

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "leak_experiment"
sys.path.insert(0, str(EXAMPLE))

import report  # noqa: E402
import train  # noqa: E402


def write_corpus(folder, split, docs):
    data = b"".join(docs)
    (folder / f"{split}.bin").write_bytes(data)
    offsets = np.cumsum([0] + [len(d) for d in docs]).tolist()
    (folder / f"{split}_offsets.bin").write_bytes(struct.pack(f"<{len(offsets)}q", *offsets))


def test_load_rows_restarts_positions_at_every_document(tmp_path):
    write_corpus(tmp_path, "train", [b"abcde", b"xy", b"0123456789"])
    ids, positions = train.load_rows(tmp_path, "train", 8)
    assert ids.shape == (2, 8) and positions.shape == (2, 8)  # 17 bytes: two full rows, 1 byte dropped
    assert bytes(ids[0]) == b"abcdexy0" and bytes(ids[1]) == b"12345678"
    assert positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0]
    assert positions[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # a split document's piece restarts at 0


def write_run(runs, name, evals, speed):
    folder = runs / name
    folder.mkdir(parents=True)
    lines = [{"step": 25, "train_loss": 3.0, "tokens_per_s": 1.0}, {"step": 50, "train_loss": 2.0, "tokens_per_s": speed}]
    lines += [{"step": s, "val_own": own, "val_ref": ref, "gap": ref - own} for s, own, ref in evals]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_report_table_averages_seeds_and_reports_the_gap(tmp_path):
    write_run(tmp_path, "bf16_s0", [(100, 1.50, 1.50), (200, 1.20, 1.20)], 1000.0)
    write_run(tmp_path, "bf16_s1", [(200, 1.22, 1.22)], 3000.0)
    write_run(tmp_path, "leaky_s0", [(200, 1.00, 1.40)], 2000.0)
    write_run(tmp_path, "leaky_s1", [(200, 1.02, 1.50)], 2000.0)
    (tmp_path / "notes").mkdir()  # not a run folder: ignored
    table = report.markdown(report.load(tmp_path))
    lines = table.splitlines()
    bf16 = next(line for line in lines if line.startswith("| bf16 "))
    leaky = next(line for line in lines if line.startswith("| leaky "))
    assert "| 2 | 200 | 1.2100 ± 0.0100 | 1.2100 ± 0.0100 | 0.0000 ± 0.0000 | 2.0k |" in bf16
    assert "| 1.0100 ± 0.0100 | 1.4500 ± 0.0500 | 0.4400 ± 0.0400 |" in leaky
    assert lines.index(bf16) < lines.index(leaky)
