"""Hugging Face safetensors models load in dcp (HuggingFaceStorageReader) at any world size.

Files written by the safetensors package (one file, and a sharded model with its
model.safetensors.index.json; float32, bfloat16, float16, int64, bool, 0-d and empty tensors)
are loaded by C++ on 1 and 3 in-process ranks, each rank reading its rows, saved as a DCP
checkpoint, and that checkpoint loaded by Python DCP must equal the original tensors bit for
bit. Hostile headers are refused with the file named.

Environment: DCP_INTEROP_TOOL (tests/interop/interop_tool.cpp).
"""
import json
import os
import struct
import subprocess
import tempfile
import unittest

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

TOOL = os.environ.get("DCP_INTEROP_TOOL", "")


def model_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(50, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).bfloat16(),
        "model.layers.0.mlp.up_proj.weight": torch.randn(7, 16, generator=g).half(),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=g),
        "model.position_ids": torch.arange(37, dtype=torch.int64),
        "model.mask": torch.rand(5, 3, generator=g) > 0.5,
        "model.scale": torch.tensor(2.5),
        "model.empty": torch.zeros(0, 4),
    }


def run(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


class SafetensorsModels(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TOOL, "DCP_INTEROP_TOOL is not set")

    def check_loads(self, hf_dir, tensors):
        for world in (1, 3):
            with self.subTest(world=world), tempfile.TemporaryDirectory() as out:
                proc = run("hf-to-dcp", hf_dir, str(world), out)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                loaded = {k: torch.empty_like(v) for k, v in tensors.items()}
                dcp.load(loaded, checkpoint_id=out, no_dist=True)
                for k, v in tensors.items():
                    self.assertEqual(loaded[k].dtype, v.dtype, k)
                    self.assertTrue(torch.equal(loaded[k], v), k)

    def test_single_file_model(self):
        tensors = model_tensors()
        with tempfile.TemporaryDirectory() as d:
            save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            self.check_loads(d, tensors)

    def test_sharded_model_with_index(self):
        tensors = model_tensors()
        names = sorted(tensors)
        shards = [names[: len(names) // 2], names[len(names) // 2:]]
        with tempfile.TemporaryDirectory() as d:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file({k: tensors[k] for k in shard}, os.path.join(d, fname))
                weight_map.update({k: fname for k in shard})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
            with open(os.path.join(d, "unrelated.safetensors"), "wb") as f:
                f.write(b"not read: the index names the files")
            self.check_loads(d, tensors)

    def test_hostile_headers_are_refused_naming_the_file(self):
        def write(d, header, data=b""):
            raw = json.dumps(header).encode()
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(struct.pack("<Q", len(raw)) + raw + data)

        cases = {
            "out_of_bounds": ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                              b"\0" * 8, "leave the data section"),
            "overlap": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                        b"\0" * 12, "share bytes"),
            "shape_mismatch": ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                               b"\0" * 8, "needs 12 bytes"),
            "dtype": ({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}},
                      b"\0" * 8, "unknown safetensors dtype 'F33'"),
        }
        for name, (header, data, message) in cases.items():
            with self.subTest(case=name), tempfile.TemporaryDirectory() as d, \
                    tempfile.TemporaryDirectory() as out:
                write(d, header, data)
                proc = run("hf-to-dcp", d, "1", out)
                self.assertNotEqual(proc.returncode, 0)
                self.assertIn(message, proc.stderr)
                self.assertIn("model.safetensors", proc.stderr)
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as out:
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(struct.pack("<Q", 1 << 40) + b"{}")
            proc = run("hf-to-dcp", d, "1", out)
            self.assertIn("a safetensors header of 1099511627776 bytes", proc.stderr)


if __name__ == "__main__":
    unittest.main()
