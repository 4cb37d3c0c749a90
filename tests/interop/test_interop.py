"""Interop against real Python DCP (torch 2.13): checkpoints written by dcp (C++) load in
torch.distributed.checkpoint, and the other way round, with every value compared bit for bit.

Run by ctest (label 'interop') with the repo's venv Python; DCP_INTEROP_TOOL names the C++
tool (tests/interop/interop_tool.cpp)."""
import io
import itertools
import os
import pickle
import pickletools
import subprocess
import tempfile
import unittest
import warnings
import zipfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._extension import ZStandard

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import (_compute_local_shape_and_global_offset,
                                             _get_shard_size_and_offsets)
from torch.distributed.tensor.placement_types import _StridedShard
from values import blank_like, difference, make_tensor, reference_state_dict

TOOL = os.environ.get("DCP_INTEROP_TOOL", "")
warnings.filterwarnings("ignore")

MD = "torch.distributed.checkpoint.metadata"
ALLOWED_METADATA_GLOBALS = {
    (MD, "Metadata"), (MD, "TensorStorageMetadata"), (MD, "TensorProperties"),
    (MD, "_MEM_FORMAT_ENCODING"), (MD, "ChunkStorageMetadata"), (MD, "BytesStorageMetadata"),
    (MD, "MetadataIndex"), (MD, "StorageMeta"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch", "strided"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Allows only the globals of docs/format.md section 2 (what a restricted loader would)."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED_METADATA_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


def run_tool(*args):
    proc = subprocess.run([TOOL, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"interop_tool {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


class CppSavesPythonLoads(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TOOL, "DCP_INTEROP_TOOL is not set")

    def test_python_dcp_load_gets_every_value_back(self):
        for layout in ([], ["--threads", "3"], ["--file-per-item"], ["--zstd"],
                       ["--zstd", "--threads", "2"], ["--cached"]):
            with self.subTest(layout=layout), tempfile.TemporaryDirectory() as d:
                run_tool("save", d, *layout)
                if "--zstd" in layout:  # every item goes through Python's ZStandard extension
                    md = FileSystemReader(d).read_metadata()
                    self.assertTrue(all(info.transform_descriptors == ["stream.zstd/1"]
                                        for info in md.storage_data.values()))
                loaded = blank_like(reference_state_dict())
                dcp.load(loaded, checkpoint_id=d, no_dist=True)
                self.assertIsNone(difference(reference_state_dict(), loaded))

    def test_metadata_reads_with_filesystemreader_pickletools_and_a_restricted_unpickler(self):
        with tempfile.TemporaryDirectory() as d:
            run_tool("save", d)
            md = FileSystemReader(d).read_metadata()
            raw = open(os.path.join(d, ".metadata"), "rb").read()
            pickletools.dis(raw, out=io.StringIO())
            restricted = RestrictedUnpickler(io.BytesIO(raw)).load()
            self.assertEqual(restricted.state_dict_metadata.keys(), md.state_dict_metadata.keys())
            self.assertEqual(md.planner_data["optim.param_groups.0.lr"],
                             ("optim", "param_groups", 0, "lr"))
            self.assertEqual(md.version, "1.0.0")
            self.assertEqual(md.storage_meta.modules, [])

            # Same keys, shapes and dtypes as Python's own save of the same state dict.
            with tempfile.TemporaryDirectory() as p:
                dcp.save(reference_state_dict(), checkpoint_id=p, no_dist=True)
                py = FileSystemReader(p).read_metadata()
            # In Python's order, not merely the same set.
            self.assertEqual(list(md.state_dict_metadata), list(py.state_dict_metadata))
            for key, entry in py.state_dict_metadata.items():
                ours = md.state_dict_metadata[key]
                self.assertEqual(type(ours), type(entry), key)
                if hasattr(entry, "size"):
                    self.assertEqual(ours.size, entry.size, key)
                    self.assertEqual(ours.properties.dtype, entry.properties.dtype, key)
                    self.assertEqual(ours.chunks, entry.chunks, key)
            self.assertEqual(md.planner_data, py.planner_data)
            self.assertEqual(set(md.storage_data), set(py.storage_data))

    def test_every_tensor_record_loads_with_weights_only(self):
        with tempfile.TemporaryDirectory() as d:
            run_tool("save", d)
            md = FileSystemReader(d).read_metadata()
            for index, info in md.storage_data.items():
                with open(os.path.join(d, info.relative_path), "rb") as f:
                    f.seek(info.offset)
                    blob = f.read(info.length)
                names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
                self.assertIn("archive/data.pkl", names, index.fqn)
                self.assertIn("archive/byteorder", names, index.fqn)
                data_pkl = zipfile.ZipFile(io.BytesIO(blob)).read("archive/data.pkl")
                pickletools.dis(data_pkl, out=io.StringIO())
                if index.offset is not None:  # a tensor item
                    t = torch.load(io.BytesIO(blob), weights_only=True)
                    self.assertIsInstance(t, torch.Tensor, index.fqn)
                    self.assertEqual(list(t.shape), list(md.state_dict_metadata[index.fqn].size))


class ReplicatedItemPlacement(unittest.TestCase):
    """Which rank stores each replicated item: dcp's de-duplication against Python's own
    dedup_save_plans on the same plans (empty tensors weigh 1, 0-d tensors their element size,
    byte items 1)."""

    def test_each_item_is_stored_by_the_rank_python_chooses(self):
        from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
        from torch.distributed.checkpoint.default_planner import (
            create_default_local_save_plan)
        one = torch.ones
        state = {"e0": torch.zeros(0), "s0": one(()), "b0": 7, "t0": one(3),
                 "e1": torch.zeros(0, 5, dtype=torch.int64), "s1": one((), dtype=torch.int64),
                 "b1": "text", "t1": one(2, 2), "e2": torch.zeros(0), "b2": 3.5,
                 "s2": one((), dtype=torch.bfloat16), "t2": one(5), "s3": one(()), "s4": one(())}
        plans = [create_default_local_save_plan(state, r == 0) for r in range(4)]
        expected = {item.index.fqn: r for r, plan in enumerate(dedup_save_plans(plans))
                    for item in plan.items}
        self.assertEqual(len(expected), len(state))
        with tempfile.TemporaryDirectory() as d:
            run_tool("save-replicated", d)
            md = FileSystemReader(d).read_metadata()
            got = {index.fqn: int(info.relative_path.split("_")[2])
                   for index, info in md.storage_data.items()}
        self.assertEqual(got, expected)


class ValuesCppCannotHold(unittest.TestCase):
    """Python values that C++ cannot hold are refused with the key and what the value is, not
    as corruption."""

    def test_big_ints_and_odd_dict_keys_are_named(self):
        cases = {
            "big": ({"opt": {"count": 2**70}}, "'opt.count'",
                    "a Python int that does not fit in 64 bits (1180591620717411303424, 9 bytes)"),
            "negative": ({"n": -(2**80)}, "'n'", "(-1208925819614629174706176, 11 bytes)"),
            "tuple_key": ({"t": ({(1, 2): 3},)}, "'t'", "a dict with a key of Python type tuple"),
            "float_key": ({"hp": ({1.5: "x"}, 2)}, "'hp'", "a dict with a key of Python type float"),
        }
        for name, (state, key, what) in cases.items():
            with self.subTest(case=name), tempfile.TemporaryDirectory() as d:
                dcp.save(state, checkpoint_id=d, no_dist=True)
                proc = subprocess.run([TOOL, "load-all", d], capture_output=True, text=True)
                self.assertNotEqual(proc.returncode, 0)
                self.assertIn(what, proc.stderr)
                self.assertIn(f"reading {key}", proc.stderr)
                self.assertNotIn("corrupt", proc.stderr)


def parse_placement(text):
    if text == "R":
        return Replicate()
    if text.startswith("SS"):
        dim, factor = text[2:].split("x")
        return _StridedShard(int(dim), split_factor=int(factor))
    return Shard(int(text[1:]))


def dtensor_box(shape, mesh, coord, placements):
    """DTensor's box for one rank, or "E" when its indices are not one range per dimension
    (Python's DCP would then save a wrong chunk: it takes the first offset and the size)."""
    offsets, local = {}, list(shape)
    for m, p in enumerate(placements):
        if isinstance(p, Replicate):
            continue
        size, idx = _get_shard_size_and_offsets(local[p.dim], mesh[m], coord[m], p,
                                                offsets.get(p.dim), shape[p.dim], False)
        local[p.dim], offsets[p.dim] = size, idx
    for d, idx in offsets.items():
        idx = idx.tolist()
        if local[d] > 0 and idx != list(range(idx[0], idx[0] + len(idx))):
            return "E"
    size, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), placements)
    return ",".join(map(str, offset)) + "/" + ",".join(map(str, size))


class StridedShardLayouts(unittest.TestCase):
    """_StridedShard (FSDP2 over tensor parallelism): dcp's compute_local_box against DTensor's
    own offsets, and a checkpoint saved in that layout loaded whole by Python."""

    def test_every_rank_box_matches_dtensor(self):
        shapes = [(8, 3), (10, 3), (7,), (16, 5), (3, 4), (0, 4), (12, 6)]
        meshes = [(2, 2), (2, 3), (3, 2), (4,), (2, 2, 2)]
        kinds = ["R", "S0", "S1", "SS0x2", "SS0x3", "SS1x2", "SS0x4"]
        cases = []
        for shape, mesh in itertools.product(shapes, meshes):
            for spec in itertools.product(kinds, repeat=len(mesh)):
                if any(p != "R" and int(p[2 if p.startswith("SS") else 1]) >= len(shape)
                       for p in spec):
                    continue
                if not any(p.startswith("SS") for p in spec) and len(cases) % 3:
                    continue  # plain Shard layouts are covered elsewhere; keep a third
                cases.append((shape, mesh, spec))
        lines = "".join(f"{','.join(map(str, s))}|{','.join(map(str, m))}|{','.join(p)}\n"
                        for s, m, p in cases)
        proc = subprocess.run([TOOL, "local-boxes", "-"], input=lines, capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        got = proc.stdout.splitlines()
        self.assertEqual(len(got), len(cases))
        refused = 0
        for (shape, mesh, spec), line in zip(cases, got):
            placements = [parse_placement(p) for p in spec]
            want = [dtensor_box(shape, mesh, coord, placements)
                    for coord in itertools.product(*(range(m) for m in mesh))]
            self.assertEqual(line.split(";"), want, f"{shape} on {mesh} as {spec}")
            refused += "E" in want
        self.assertGreater(refused, 0)  # non-contiguous layouts exist and are refused
        self.assertGreater(len(cases) - refused, 100)

    def test_fsdp_over_tensor_parallel_checkpoint_loads_whole_in_python(self):
        with tempfile.TemporaryDirectory() as d:
            run_tool("save-strided", d)
            loaded = {"even": torch.zeros(8, 3), "wide": torch.zeros(16, 5, dtype=torch.bfloat16)}
            dcp.load(loaded, checkpoint_id=d, no_dist=True)
            self.assertTrue(torch.equal(loaded["even"], make_tensor(torch.float32, (8, 3), 11)))
            self.assertTrue(torch.equal(loaded["wide"], make_tensor(torch.bfloat16, (16, 5), 12)))


class PythonSavesCppLoads(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TOOL, "DCP_INTEROP_TOOL is not set")

    def test_cpp_load_gets_every_value_back(self):
        layouts = {
            "default": dict(),
            "four_threads": dict(thread_count=4),
            "file_per_item": dict(single_file_per_rank=False),
            "no_sync": dict(sync_files=False),
            "zstd": dict(_extensions=[ZStandard()]),
            "zstd_file_per_item": dict(_extensions=[ZStandard()], single_file_per_rank=False),
        }
        for name, kwargs in layouts.items():
            with self.subTest(layout=name), tempfile.TemporaryDirectory() as d:
                dcp.save(reference_state_dict(), storage_writer=FileSystemWriter(d, **kwargs),
                         no_dist=True)
                out = run_tool("load", d)
                self.assertIn("every value equal", out)
                # Python's pickle of it takes the direct decoder, not the object tree.
                out = run_tool("decoders", os.path.join(d, ".metadata"))
                self.assertIn("direct decoder equal to the tree decoder", out)

    def test_python_resave_over_a_dcp_checkpoint_leaves_a_stale_checksum_that_is_ignored(self):
        # dcp writes '.metadata.checksum' beside '.metadata'; Python DCP neither reads nor
        # rewrites it, so after Python saves into the same directory the checksum describes
        # another save. dcp must tell that from corruption: the load succeeds.
        with tempfile.TemporaryDirectory() as d:
            run_tool("save", d)
            checksum = os.path.join(d, ".metadata.checksum")
            self.assertTrue(os.path.exists(checksum))
            before = open(checksum, "rb").read()
            dcp.save(reference_state_dict(), checkpoint_id=d, no_dist=True)
            self.assertEqual(open(checksum, "rb").read(), before)
            out = run_tool("load", d)
            self.assertIn("every value equal", out)


if __name__ == "__main__":
    unittest.main()
