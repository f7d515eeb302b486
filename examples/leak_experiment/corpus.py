"""Byte-level natural-language corpus for the leak experiment: the English documentation of the
Linux kernel, as Debian's linux-source package ships it (about 26 MB of .rst/.txt in 6.1).

Reproducible: documents are the Documentation/ files (translations excluded) in sorted path order;
a file belongs to validation when the SHA-1 of its path falls in the first 1/20 of the hash space,
so the split does not depend on the file order or on which other files exist. The manifest records
the package version, the SHA-256 of the source tarball and of every output.

Outputs in --out: train.bin / val.bin (the documents' bytes, concatenated), train_offsets.bin /
val_offsets.bin (int64 little-endian document start offsets plus the end), manifest.json.

Run it on a machine that reaches Debian's packages (the GPU machine does not; copy --out there):
    python3 examples/leak_experiment/corpus.py --out .carry/corpus
"""
import argparse
import hashlib
import io
import json
import pathlib
import struct
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "linux-source-6.1"
MIN_BYTES = 20 * 1024 * 1024
VALIDATION_BUCKETS = 20  # 1 in 20 documents (by path hash) is validation
TEXT_SUFFIXES = (".rst", ".txt")


def is_validation(path: str) -> bool:
    return int.from_bytes(hashlib.sha1(path.encode()).digest()[:8], "big") % VALIDATION_BUCKETS == 0


def documentation_files(source_tar: tarfile.TarFile):
    """(path under Documentation/, bytes) of every English .rst/.txt file, in sorted path order."""
    docs = {}
    for member in source_tar:
        if not member.isfile() or not member.name.endswith(TEXT_SUFFIXES):
            continue
        parts = member.name.split("/")
        if "Documentation" not in parts:
            continue
        rel = "/".join(parts[parts.index("Documentation"):])
        if rel.startswith("Documentation/translations/"):
            continue
        data = source_tar.extractfile(member).read()
        if b"\0" in data:  # not text
            continue
        docs[rel] = data
    return sorted(docs.items())


def write_split(out: pathlib.Path, name: str, docs):
    offsets, pos = [], 0
    with open(out / f"{name}.bin", "wb") as f:
        for _, data in docs:
            offsets.append(pos)
            f.write(data)
            pos += len(data)
    offsets.append(pos)
    (out / f"{name}_offsets.bin").write_bytes(struct.pack(f"<{len(offsets)}q", *offsets))
    return {"documents": len(docs), "bytes": pos}


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(source_tar_bytes: bytes, out: pathlib.Path, provenance: dict, min_bytes: int = MIN_BYTES) -> dict:
    """Writes the corpus from an xz/gz/plain tarball of a kernel source tree; returns the manifest."""
    with tarfile.open(fileobj=io.BytesIO(source_tar_bytes), mode="r:*") as tar:
        docs = documentation_files(tar)
    total = sum(len(d) for _, d in docs)
    if total < min_bytes:
        raise SystemExit(f"corpus.py: only {total} bytes of documentation found, need at least {min_bytes}")
    out.mkdir(parents=True, exist_ok=True)
    train = [d for d in docs if not is_validation(d[0])]
    val = [d for d in docs if is_validation(d[0])]
    manifest = {
        **provenance,
        "source_tar_sha256": hashlib.sha256(source_tar_bytes).hexdigest(),
        "split": f"validation = sha1(path) % {VALIDATION_BUCKETS} == 0",
        "train": write_split(out, "train", train),
        "val": write_split(out, "val", val),
    }
    manifest["outputs"] = {p.name: sha256_file(p) for p in sorted(out.glob("*.bin"))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def source_tarball_from_deb(deb: pathlib.Path) -> bytes:
    """The kernel source tarball inside a linux-source .deb (read with dpkg-deb, no install)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            if member.name.endswith((".tar.xz", ".tar.gz", ".tar.bz2")) and "/usr/src/" in "/" + member.name.lstrip("./"):
                data = outer.extractfile(member).read()
                proc.wait()
                return data
    raise SystemExit(f"corpus.py: no source tarball inside {deb}")


def download_deb(package: str, directory: pathlib.Path) -> pathlib.Path:
    print(f"corpus.py: downloading {package} from Debian's packages", file=sys.stderr)
    subprocess.run(["apt-get", "download", package], cwd=directory, check=True)
    debs = sorted(directory.glob(f"{package}_*.deb"))
    if not debs:
        raise SystemExit(f"corpus.py: apt-get download {package} produced no .deb")
    return debs[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    ap.add_argument("--deb", type=pathlib.Path, help=f"an already downloaded {PACKAGE} .deb (default: apt-get download)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        deb = args.deb or download_deb(PACKAGE, pathlib.Path(tmp))
        version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        print(f"corpus.py: reading {deb.name}", file=sys.stderr)
        manifest = build(source_tarball_from_deb(deb), args.out, {"package": PACKAGE, "version": version})
    print(json.dumps({k: manifest[k] for k in ("package", "version", "train", "val")}))


if __name__ == "__main__":
    main()
