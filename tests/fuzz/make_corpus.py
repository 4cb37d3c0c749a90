"""Regenerates the fuzzers' seed corpus (tests/fuzz/corpus) from real checkpoints: the
reference state dict of the interop tests saved by Python DCP (torch 2.13, one file per rank
and one per item) and by dcp (interop_tool). Writes
  corpus/metadata/<writer>.metadata          the '.metadata' files
  corpus/record/<writer>_<n>                 each record's bytes, cut out with storage_data
  corpus/record_pickle/<writer>_<n>.pkl      each record's data.pkl
  corpus/safetensors/<name>.safetensors      files of the safetensors package and of dcp's
                                             HuggingFaceStorageWriter
Records are deduplicated by content; those over 16 KiB, and all past the first 40 of a
writer, are left out (the per-item layout gives its .metadata only).

  .venv/bin/python tests/fuzz/make_corpus.py <interop_tool> <corpus_dir> [checkpoint_dir ...]

Each extra checkpoint_dir (a sharded one, for instance the mpi tests' w16_mesh2d) adds its
'.metadata' as corpus/metadata/extra_<k>.metadata."""
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
from values import reference_state_dict  # noqa: E402

warnings.filterwarnings("ignore")
MAX_RECORD = 16 << 10
MAX_RECORDS = 40  # per writer: the corpus stays small enough to commit


def harvest(directory, writer, out, records=True):
    seen = set()
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        write(out, "metadata", f"{writer}.metadata", f.read())
    if not records:
        return
    md = FileSystemReader(directory).read_metadata()
    n = 0
    for info in md.storage_data.values():
        if info.length > MAX_RECORD or n >= MAX_RECORDS:
            continue
        with open(os.path.join(directory, info.relative_path), "rb") as f:
            f.seek(info.offset)
            record = f.read(info.length)
        digest = hashlib.sha1(record).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        write(out, "record", f"{writer}_{n}", record)
        with zipfile.ZipFile(io.BytesIO(record)) as z:
            pkl = next(name for name in z.namelist() if name.endswith("/data.pkl"))
            write(out, "record_pickle", f"{writer}_{n}.pkl", z.read(pkl))
        n += 1


def write(out, kind, name, data):
    os.makedirs(os.path.join(out, kind), exist_ok=True)
    with open(os.path.join(out, kind, name), "wb") as f:
        f.write(data)


def main():
    tool = sys.argv[1]
    out = sys.argv[2]
    for k, extra in enumerate(sys.argv[3:]):
        harvest(extra, f"extra_{k}", out, records=False)
    with tempfile.TemporaryDirectory() as d:
        py_rank = os.path.join(d, "py_rank")
        dcp.save(reference_state_dict(), checkpoint_id=py_rank, no_dist=True)
        harvest(py_rank, "python", out)
        py_item = os.path.join(d, "py_item")
        dcp.save(reference_state_dict(), no_dist=True,
                 storage_writer=FileSystemWriter(py_item, single_file_per_rank=False))
        harvest(py_item, "python_per_item", out, records=False)
        cc = os.path.join(d, "dcp")
        subprocess.run([tool, "save", cc], check=True, capture_output=True)
        harvest(cc, "dcp", out)
        from safetensors.torch import save as save_safetensors
        write(out, "safetensors", "two_tensors.safetensors", save_safetensors(
            {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
             "b": torch.ones(2, dtype=torch.bfloat16)}, metadata={"format": "pt"}))
        write(out, "safetensors", "odd_shapes.safetensors", save_safetensors(
            {"s": torch.tensor(1.5), "e": torch.zeros(0, 3), "m": torch.tensor([True, False])}))
        hf = os.path.join(d, "hf")
        subprocess.run([tool, "save-hf", hf, "1"], check=True, capture_output=True)
        with open(os.path.join(hf, "model-00002-of-00002.safetensors"), "rb") as f:
            write(out, "safetensors", "dcp_writer.safetensors", f.read())


if __name__ == "__main__":
    main()
