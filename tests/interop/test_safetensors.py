"""Hugging Face safetensors models load in dcp (HuggingFaceStorageReader) at any world size.

Files written by the safetensors package (one file, and a sharded model with its
model.safetensors.index.json; float32, bfloat16, float16, int64, bool, 0-d and empty tensors)
are loaded by C++ on 1 and 3 in-process ranks, each rank reading its rows, saved as a DCP
checkpoint, and that checkpoint loaded by Python DCP must equal the original tensors bit for
bit. Hostile headers are refused with the file named.

Environment: DCP_INTEROP_TOOL (tests/interop/interop_tool.cpp).
"""
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import tempfile
import unittest
from unittest import mock

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

from values import make_tensor

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


def _distributed_writer(rank, world, port, path, errors):
    import warnings

    import torch.distributed as dist
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        state = {k: distribute_tensor(v, mesh, [Shard(0)]) if v.dim() else v
                 for k, v in model_tensors().items() if v.numel()}
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
        dist.barrier()
    except Exception as e:
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


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

    def test_a_transformer_saved_by_python(self):
        torch.manual_seed(0)
        model = torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2,
                                     num_decoder_layers=2, dim_feedforward=128)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        with tempfile.TemporaryDirectory() as d:
            save_file(tensors, os.path.join(d, "model.safetensors"))
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

    def test_python_hf_writer_save_distributed_chunks_reassemble(self):
        """Python's HuggingFaceStorageWriter(save_distributed=True) on 2 processes: each rank's
        row chunks in its own files, offsets in DCP_SHARDING_INFO."""
        tensors = {k: v for k, v in model_tensors().items() if v.numel()}
        with tempfile.TemporaryDirectory() as d:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            ctx = mp.get_context("spawn")
            errors = ctx.Queue()
            procs = [ctx.Process(target=_distributed_writer, args=(r, 2, port, d, errors))
                     for r in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(300)
            self.assertTrue(errors.empty(), errors.get() if not errors.empty() else "")
            self.assertGreaterEqual(len([n for n in os.listdir(d) if n.endswith(".safetensors")]), 2)
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
            # an empty chunk may claim any shape; its saved offset must not overflow the extent
            "extent_overflow": ({"__metadata__": {"DCP_SHARDING_INFO": json.dumps(
                                    {"w": {"saved_offsets": [2**62 - 1, 0]}})},
                                 "w": {"dtype": "F32", "shape": [2**63 - 1, 0],
                                       "data_offsets": [0, 0]}},
                                b"", "ends past 2^63"),
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


def cpp_hf_tensors():
    """What `interop_tool save-hf` writes."""
    return {"model.embed.weight": make_tensor(torch.float32, (10, 6), 1),
            "model.proj.weight": make_tensor(torch.bfloat16, (17, 5), 2),
            "model.ids": make_tensor(torch.int64, (3, 4), 3),
            "model.scale": make_tensor(torch.float32, (), 4)}


class CppWritesSafetensors(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TOOL, "DCP_INTEROP_TOOL is not set")

    def python_reader_loads(self, d, expected):
        loaded = {k: torch.zeros_like(v) for k, v in expected.items()}
        dcp.load(loaded, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
        for k, v in expected.items():
            self.assertTrue(torch.equal(loaded[k], v), k)

    def test_one_rank_writes_a_model_the_safetensors_package_and_python_read(self):
        expected = cpp_hf_tensors()
        with tempfile.TemporaryDirectory() as d:
            proc = run("save-hf", d, "1")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                index = json.load(f)
            self.assertEqual(index["weight_map"], {
                "model.embed.weight": "model-00001-of-00002.safetensors",
                "model.scale": "model-00001-of-00002.safetensors",
                "model.proj.weight": "model-00002-of-00002.safetensors",
                "model.ids": "model-00002-of-00002.safetensors"})
            got = {}
            for name in set(index["weight_map"].values()):
                got.update(load_file(os.path.join(d, name)))
            self.assertEqual(sorted(got), sorted(expected))
            for k, v in expected.items():
                self.assertEqual(got[k].dtype, v.dtype, k)
                self.assertTrue(torch.equal(got[k], v), k)
            self.python_reader_loads(d, expected)
            with tempfile.TemporaryDirectory() as out:  # and dcp's own reader, on 3 ranks
                proc = run("hf-to-dcp", d, "3", out)
                self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_three_ranks_save_distributed_chunks_python_reassembles(self):
        expected = cpp_hf_tensors()
        with tempfile.TemporaryDirectory() as d:
            proc = run("save-hf", d, "3", "distributed")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            names = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
            self.assertIn("shard-00001-model-00001-of-00002.safetensors", names)
            self.assertNotIn("model.safetensors.index.json", os.listdir(d))
            self.python_reader_loads(d, expected)

    def test_three_ranks_consolidated_as_pythons_consolidation_writes_it(self):
        expected = cpp_hf_tensors()
        mapping = {"model.embed.weight": 1, "model.proj.weight": 2, "model.ids": 2,
                   "model.scale": 1}
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as ref:
            proc = run("save-hf", d, "3", "consolidated")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            sharded = os.path.join(d, "sharded")
            self.assertIn("shard-00003-model-00002-of-00002.safetensors", os.listdir(sharded))
            # Python's own consolidation of the same chunks is the reference. It sizes dtypes
            # with torch.finfo, which raises for integer dtypes (torch 2.13), so integer
            # tensors get torch.iinfo for the length of this call.
            finfo = torch.finfo

            def finfo_or_iinfo(dtype):
                return finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)

            with mock.patch.object(torch, "finfo", finfo_or_iinfo):
                consolidate_safetensors_files(sharded, ref, fqn_to_index_mapping=mapping)
            names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
            self.assertEqual(sorted(n for n in os.listdir(d) if n.endswith(".safetensors")),
                             names)
            got, want = {}, {}
            for name in names:
                ours, theirs = load_file(os.path.join(d, name)), load_file(os.path.join(ref, name))
                self.assertEqual(sorted(ours), sorted(theirs), name)
                got.update(ours)
                want.update(theirs)
            for k, v in expected.items():
                self.assertEqual(got[k].dtype, v.dtype, k)
                self.assertTrue(torch.equal(got[k], v), k)
                if v.dim() > 0:  # Python's consolidation writes 0 for a 0-d tensor (2.13)
                    self.assertTrue(torch.equal(got[k], want[k]), k)
            index = {}
            for where in (d, ref):
                with open(os.path.join(where, "model.safetensors.index.json")) as f:
                    index[where] = json.load(f)
            self.assertEqual(index[d], index[ref])
            self.python_reader_loads(d, expected)
            with tempfile.TemporaryDirectory() as out:  # and dcp's own reader, on 2 ranks
                proc = run("hf-to-dcp", d, "2", out)
                self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_errors(self):
        with tempfile.TemporaryDirectory() as d:  # 3 ranks writing whole tensors would collide
            proc = run("save-hf", d, "3")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("without save_distributed they would write the same files", proc.stderr)


if __name__ == "__main__":
    unittest.main()
