"""The leak experiment's data pipeline (examples/leak_experiment): corpus extraction and packing,
on a small synthetic kernel tree (the real one needs Debian's linux-source package)."""
import io
import json
import pathlib
import sys
import tarfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "leak_experiment"))
import corpus  # noqa: E402
import packing  # noqa: E402


def fake_source_tar(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


FILES = {
    **{f"linux-source-6.1/Documentation/sub{i % 3}/doc{i}.rst": f"Document {i}\n".encode() * (i + 1) for i in range(60)},
    "linux-source-6.1/Documentation/notes.txt": b"plain text notes\n",
    "linux-source-6.1/Documentation/translations/zh_CN/index.rst": "翻译".encode(),
    "linux-source-6.1/Documentation/logo.gif.txt": b"GIF89a\0\0binary",
    "linux-source-6.1/Documentation/Makefile": b"all:\n",
    "linux-source-6.1/kernel/sched/core.c": b"int main(void) { return 0; }\n",
}


def read_split(out, name):
    data = (out / f"{name}.bin").read_bytes()
    offsets = packing.read_offsets(out / f"{name}_offsets.bin")
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def test_corpus_keeps_english_text_documents_and_splits_by_path_hash(tmp_path):
    manifest = corpus.build(fake_source_tar(FILES), tmp_path, {"package": "test"}, min_bytes=1)
    train, val = read_split(tmp_path, "train"), read_split(tmp_path, "val")
    kept = {p: d for p, d in FILES.items() if "/translations/" not in p and p.endswith((".rst", ".txt"))
            and b"\0" not in d}
    assert len(train) + len(val) == len(kept) == 61
    assert sorted(train + val) == sorted(kept.values())
    expected_val = [d for p, d in sorted(kept.items()) if corpus.is_validation(p.split("linux-source-6.1/")[1])]
    assert val == expected_val and 0 < len(val) < len(train)
    assert manifest["train"]["documents"] == len(train) and manifest["val"]["bytes"] == sum(map(len, val))
    assert json.loads((tmp_path / "manifest.json").read_text())["outputs"]["train.bin"] == manifest["outputs"]["train.bin"]


def test_corpus_is_reproducible_and_independent_of_archive_order(tmp_path):
    a = corpus.build(fake_source_tar(FILES), tmp_path / "a", {}, min_bytes=1)
    b = corpus.build(fake_source_tar(dict(reversed(list(FILES.items())))), tmp_path / "b", {}, min_bytes=1)
    assert a["outputs"] == b["outputs"]


def test_corpus_refuses_too_little_text(tmp_path):
    with pytest.raises(SystemExit, match="need at least"):
        corpus.build(fake_source_tar(FILES), tmp_path, {}, min_bytes=10**9)


def test_packing_fills_rows_exactly_and_keeps_every_byte_in_order():
    offsets = [0, 5, 5, 17, 40, 41, 100]  # includes an empty and a long document
    rows = packing.pack(offsets, 16)
    assert all(packing.cu_seqlens(r)[-1] == 16 for r in rows)
    flat = [span for r in rows for span in r]
    covered = [i for a, b in flat for i in range(a, b)]
    assert covered == list(range(len(rows) * 16))  # in order, no gaps; the partial tail is dropped
    for r in rows:
        cu = packing.cu_seqlens(r)
        assert all(x < y for x, y in zip(cu, cu[1:]))  # no empty documents inside a row
    with pytest.raises(ValueError):
        packing.pack(offsets, 0)
