"""The `dcp` command-line tool (cli/) on checkpoints written by Python DCP (torch 2.13) and by
dcp: every subcommand, its JSON against Python's own reading of the metadata, the converted
files checked with torch.load and Python DCP, and bad input (one line on stderr, exit 2,
never a crash or a LibTorch stack).

Run by ctest (label 'cli') with the repo's venv Python; DCP_CLI names the tool,
DCP_INTEROP_TOOL the C++ saver, DCP_MPI_TOOL and DCP_MPIRUN the multi-rank saver."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
from values import blank_like, reference_state_dict  # noqa: E402

warnings.filterwarnings("ignore")
CLI = os.environ.get("DCP_CLI", "")
INTEROP_TOOL = os.environ.get("DCP_INTEROP_TOOL", "")
MPI_TOOL = os.environ.get("DCP_MPI_TOOL", "")
MPIRUN = os.environ.get("DCP_MPIRUN", "mpirun")
DTYPE = {v: k.replace("torch.", "") for k, v in
         {str(d): d for d in [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                               torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                               torch.bool, torch.complex64, torch.complex128]}.items()}


def run(*args, expect=0):
    proc = subprocess.run([CLI, *args], capture_output=True, text=True)
    if proc.returncode != expect:
        raise AssertionError(f"dcp {' '.join(args)}: exit {proc.returncode}, expected {expect}\n"
                             f"{proc.stdout}{proc.stderr}")
    return proc


def same(a, b):
    """Equal values, and dicts with their keys in the same order (the tool rebuilds dicts in the
    metadata's key order, which is Python's)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


def reference_without_empty():
    sd = reference_state_dict()
    sd.pop("empty_dict", None)  # saves nothing, so a load without destination cannot see it
    return sd


class Checkpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert CLI and INTEROP_TOOL, "DCP_CLI and DCP_INTEROP_TOOL must be set"
        cls.tmp = tempfile.mkdtemp()
        cls.py = os.path.join(cls.tmp, "python")
        dcp.save(reference_state_dict(), checkpoint_id=cls.py, no_dist=True)
        cls.cc = os.path.join(cls.tmp, "dcp")
        subprocess.run([INTEROP_TOOL, "save", cls.cc], check=True, capture_output=True)
        cls.both = {"python": cls.py, "dcp": cls.cc}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)


class Inspect(Checkpoints):
    def test_json_agrees_with_python_reading_the_metadata(self):
        for writer, ckpt in self.both.items():
            with self.subTest(writer=writer):
                out = json.loads(run("inspect", ckpt, "--json").stdout)
                md = FileSystemReader(ckpt).read_metadata()
                self.assertEqual([k["key"] for k in out["keys"]], sorted(md.state_dict_metadata))
                for k in out["keys"]:
                    entry = md.state_dict_metadata[k["key"]]
                    if isinstance(entry, TensorStorageMetadata):
                        self.assertEqual(k["kind"], "tensor")
                        self.assertEqual(k["shape"], list(entry.size))
                        self.assertEqual(k["dtype"], DTYPE[entry.properties.dtype])
                        self.assertEqual(k["chunks"], len(entry.chunks))
                        self.assertEqual(k["bytes"],
                                         entry.size.numel() * entry.properties.dtype.itemsize)
                    else:
                        self.assertEqual(k["kind"], "value")
                    files = {md.storage_data[i].relative_path for i in md.storage_data
                             if i.fqn == k["key"]}
                    self.assertEqual(set(k["files"]), files)
                self.assertEqual(out["totals"]["keys"], len(md.state_dict_metadata))
                self.assertEqual(out["storage_meta"]["save_id"], md.storage_meta.save_id)
                self.assertEqual(sum(r["files"] for r in out["files_per_rank"]),
                                 len({s.relative_path for s in md.storage_data.values()}))

    def test_table_and_key_glob(self):
        for writer, ckpt in self.both.items():
            with self.subTest(writer=writer):
                table = run("inspect", ckpt).stdout
                self.assertIn("model.layers.0.weight", table)
                self.assertIn("files per rank", table)
                some = json.loads(run("inspect", ckpt, "--json", "--keys", "optim.*").stdout)
                self.assertTrue(some["keys"])
                self.assertTrue(all(k["key"].startswith("optim.") for k in some["keys"]))


class Verify(Checkpoints):
    def test_sound_checkpoints_pass(self):
        for writer, ckpt in self.both.items():
            with self.subTest(writer=writer):
                out = json.loads(run("verify", ckpt, "--json").stdout)
                self.assertTrue(out["ok"])
                self.assertGreater(out["records"], 10)
                self.assertEqual(out["metadata_checksum"],
                                 "verified" if writer == "dcp" else "absent")
                self.assertIn("sound", run("verify", ckpt, "--threads", "2").stdout)

    def test_a_flipped_byte_of_tensor_data_is_reported_with_key_file_and_range(self):
        for writer, ckpt in self.both.items():
            with self.subTest(writer=writer), tempfile.TemporaryDirectory() as d:
                bad = os.path.join(d, "bad")
                shutil.copytree(ckpt, bad)
                md = FileSystemReader(bad).read_metadata()
                index = next(i for i in md.storage_data if i.fqn == "model.layers.0.weight")
                info = md.storage_data[index]
                path = os.path.join(bad, info.relative_path)
                with open(path, "r+b") as f:  # the tensor data sit just before the zip directory
                    data = bytearray(f.read())
                    record = data[info.offset:info.offset + info.length]
                    at = info.offset + record.rfind(b"PK\x07\x08", 0, record.find(b"PK\x01\x02")) - 1
                    data[at] ^= 0xFF
                    f.seek(0)
                    f.write(data)
                proc = run("verify", bad, expect=1)
                self.assertIn("NOT SOUND", proc.stdout)
                self.assertIn("key 'model.layers.0.weight'", proc.stdout)
                self.assertIn(f"file '{info.relative_path}'", proc.stdout)
                self.assertIn(f"bytes [{info.offset}, {info.offset + info.length})", proc.stdout)


class Diff(Checkpoints):
    def test_python_and_dcp_checkpoints_of_one_state_are_equal(self):
        proc = run("diff", self.py, self.cc)
        self.assertIn("EQUAL", proc.stdout)

    def test_a_changed_tensor_is_named_with_its_largest_difference(self):
        with tempfile.TemporaryDirectory() as d:
            sd = reference_state_dict()
            sd["model"]["layers.0.weight"][1, 2] += 0.5
            changed = os.path.join(d, "changed")
            dcp.save(sd, checkpoint_id=changed, no_dist=True)
            out = json.loads(run("diff", self.cc, changed, "--json", expect=1).stdout)
            self.assertFalse(out["equal"])
            bad = [k for k in out["keys"] if k["status"] != "equal"]
            self.assertEqual([k["key"] for k in bad], ["model.layers.0.weight"])
            self.assertAlmostEqual(bad[0]["max_abs_diff"], 0.5, places=5)
            run("diff", self.cc, changed, "--keys", "optim.*")  # equal there

    def test_across_world_sizes_and_layouts(self):
        if not MPI_TOOL:
            self.fail("DCP_MPI_TOOL is not set")
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
            for n, layout in ((2, "row"), (3, "mesh2d")):
                subprocess.run([MPIRUN, "--oversubscribe", "--allow-run-as-root", "--bind-to",
                                "none", "-np", str(n), MPI_TOOL, "save",
                                os.path.join(d, f"w{n}"), layout],
                               check=True, capture_output=True, env=env)
            self.assertIn("EQUAL", run("diff", os.path.join(d, "w2"), os.path.join(d, "w3")).stdout)


class Convert(Checkpoints):
    def test_checkpoint_to_torch_save_matches_python_dcp_to_torch_save(self):
        # Python's own conversion is the reference: it also turns the optimizer's {0: state}
        # into {"0": state} (planner_data holds dict keys as strings).
        for writer, ckpt in self.both.items():
            with self.subTest(writer=writer), tempfile.TemporaryDirectory() as d:
                ours, theirs = os.path.join(d, "ours.pt"), os.path.join(d, "theirs.pt")
                run("convert", ckpt, ours)
                dcp_to_torch_save(ckpt, theirs)
                expected = torch.load(theirs, weights_only=True)
                self.assertTrue(same(torch.load(ours, weights_only=True), expected))
                self.assertEqual(expected["optim"]["state"].keys(), {"0"})

    def test_torch_save_to_checkpoint_loads_in_python_dcp(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "state.pt")
            torch.save(reference_without_empty(), src)
            ckpt = os.path.join(d, "ckpt")
            run("convert", src, ckpt)
            loaded = blank_like(reference_without_empty())
            dcp.load(loaded, checkpoint_id=ckpt, no_dist=True)
            self.assertTrue(same(loaded, reference_without_empty()))

    def test_checkpoint_to_safetensors_and_back(self):
        from safetensors.torch import load_file
        with tempfile.TemporaryDirectory() as d:
            torch.manual_seed(0)
            state = {"model": {"w": torch.randn(5, 3), "b": torch.randn(3).bfloat16()},
                     "step": 7}
            ckpt, hf, back = (os.path.join(d, n) for n in ("ckpt", "hf", "back"))
            dcp.save(state, checkpoint_id=ckpt, no_dist=True)
            out = run("convert", ckpt, hf, "--to", "safetensors").stdout
            self.assertIn("left out 1 non-tensor value(s), which safetensors cannot hold: step",
                          out)
            got = load_file(os.path.join(hf, "model-00001-of-00001.safetensors"))
            self.assertEqual(sorted(got), ["model.b", "model.w"])
            self.assertTrue(same(got["model.w"], state["model"]["w"]))
            self.assertTrue(same(got["model.b"], state["model"]["b"]))
            run("convert", hf, back, "--to", "dcp")
            loaded = {"model.w": torch.zeros(5, 3), "model.b": torch.zeros(3).bfloat16()}
            dcp.load(loaded, checkpoint_id=back, no_dist=True)
            self.assertTrue(same(loaded["model.w"], state["model"]["w"]))
            self.assertTrue(same(loaded["model.b"], state["model"]["b"]))

    def test_a_module_state_dict_round_trips(self):
        # What people torch.save: an OrderedDict with _metadata, an optimizer's state dict.
        with tempfile.TemporaryDirectory() as d:
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
            opt = torch.optim.Adam(m.parameters())
            m(torch.randn(5, 4)).sum().backward()
            opt.step()
            src, ckpt, back = (os.path.join(d, n) for n in ("full.pt", "ckpt", "back.pt"))
            torch.save({"model": m.state_dict(), "optim": opt.state_dict()}, src)
            run("convert", src, ckpt)
            run("convert", ckpt, back)
            again = torch.load(back, weights_only=True)
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(again["model"][k], v), k)
            self.assertTrue(torch.equal(again["optim"]["state"]["0"]["exp_avg"],
                                        opt.state_dict()["state"][0]["exp_avg"]))


class HostileNames(Checkpoints):
    def test_rank_number_past_int_max_in_a_file_name(self):
        # File names come from the .metadata: "__99999999999_0.distcp" parses as no rank (the
        # tool threw std::out_of_range from std::stoi and exited with "dcp: error: stoi").
        with tempfile.TemporaryDirectory() as d:
            ckpt = os.path.join(d, "renamed")
            shutil.copytree(self.py, ckpt)
            md = FileSystemReader(ckpt).read_metadata()
            renames = {}
            for info in md.storage_data.values():
                new = "__99999999999" + info.relative_path[info.relative_path.index("_", 2):]
                renames[info.relative_path] = new
                info.relative_path = new
            for old, new in renames.items():
                os.rename(os.path.join(ckpt, old), os.path.join(ckpt, new))
            with open(os.path.join(ckpt, ".metadata"), "wb") as f:
                pickle.dump(md, f)
            out = json.loads(run("inspect", ckpt, "--json").stdout)
            self.assertEqual([r["rank"] for r in out["files_per_rank"]], [-1])
            self.assertEqual(out["files_per_rank"][0]["files"], len(set(renames.values())))


class BadInput(Checkpoints):
    def expect_one_line_error(self, *args, contains):
        proc = run(*args, expect=2)
        lines = proc.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("dcp: error: "), proc.stderr)
        self.assertIn(contains, lines[0])
        self.assertNotIn("frame #", proc.stderr)

    def test_each_bad_input_is_one_line_and_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            self.expect_one_line_error("inspect", os.path.join(d, "missing"),
                                       contains="does not exist")
            self.expect_one_line_error("inspect", self.cc, "--keys", "zzz*", contains="matches")
            corrupt = os.path.join(d, "corrupt")
            shutil.copytree(self.py, corrupt)
            with open(os.path.join(corrupt, ".metadata"), "r+b") as f:
                f.truncate(100)
            self.expect_one_line_error("inspect", corrupt, contains=".metadata")
            self.expect_one_line_error("diff", corrupt, self.cc, contains=".metadata")
            self.expect_one_line_error("convert", corrupt, os.path.join(d, "x.pt"),
                                       contains=".metadata")
            text = os.path.join(d, "list.pt")
            torch.save([1, 2], text)
            self.expect_one_line_error("convert", text, os.path.join(d, "y"), contains="not a dict")
            self.expect_one_line_error("convert", os.path.join(d, "nope.pt"), os.path.join(d, "z"),
                                       contains="does not exist")
            # verify reports a missing or corrupt .metadata as a problem, not an error: exit 1.
            self.assertIn("NOT SOUND", run("verify", corrupt, expect=1).stdout)
            self.assertIn("not found", run("verify", d, expect=1).stdout)
        proc = subprocess.run([CLI], capture_output=True, text=True)
        self.assertNotEqual(proc.returncode, 0)  # no subcommand: usage, not a crash
        self.assertGreater(proc.returncode, 0)


if __name__ == "__main__":
    unittest.main()
