"""Every optimizer of dcp's get_optimizer_state_dict against the same optimizer in Python 2.13.

For Adam, AdamW (amsgrad), SGD (momentum, nesterov), RMSprop (momentum, centered) and Adagrad
(lr_decay), both ways:
  - C++ trains 3 steps and saves checkpoint A, takes one more step and saves B. Python builds
    the same model and optimizer, loads A with get_state_dict + dcp.load + set_state_dict, takes
    the same step, and must arrive at B (every parameter and optimizer state within 1e-5
    relative). Before that, the checkpoint's keys must be exactly those Python's own
    get_state_dict + dcp.save writes, and its param_groups the same names, values and types.
  - Python does the same and C++ (optimizer_tool resume) must arrive at Python's B.

Environment: DCP_OPTIMIZER_TOOL (tests/interop/optimizer_tool.cpp).
"""
import os
import shutil
import subprocess
import tempfile
import unittest
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

TOOL = os.environ.get("DCP_OPTIMIZER_TOOL")
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop", "adagrad")


def make(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    p = model.parameters()
    opt = {
        "adam": lambda: torch.optim.Adam(p, lr=1e-2),
        "adamw": lambda: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2, amsgrad=True),
        "sgd": lambda: torch.optim.SGD(p, lr=5e-2, momentum=0.9, nesterov=True),
        "rmsprop": lambda: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
        "adagrad": lambda: torch.optim.Adagrad(p, lr=1e-1, lr_decay=1e-3),
    }[name]()
    return model, opt


def step(model, opt, index):
    torch.manual_seed(1000 + index)
    x = torch.randn(64, 16)
    y = torch.randn(64, 4)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def save(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)


def load(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def flat(model, opt):
    msd, osd = get_state_dict(model, opt)
    out = {f"model.{k}": v for k, v in msd.items()}
    for fqn, s in osd["state"].items():
        out.update({f"optim.state.{fqn}.{k}": v for k, v in s.items()})
    return out


def key_tree(value):
    """The keys of every dict in `value`, in order, nested as they are."""
    if isinstance(value, dict):
        return [(k, key_tree(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [key_tree(v) for v in value]
    return None


class OptimizersAcrossLanguages(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TOOL, "DCP_OPTIMIZER_TOOL is not set")
        warnings.filterwarnings("ignore")
        torch.set_num_threads(1)
        self.dir = tempfile.mkdtemp(prefix="dcp_optim_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def tool(self, *args):
        proc = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        return proc

    def test_cpp_checkpoints_have_pythons_layout_and_resume_in_python(self):
        for name in OPTIMIZERS:
            with self.subTest(optimizer=name):
                a, b = (os.path.join(self.dir, f"cpp_{name}_{s}") for s in "ab")
                proc = self.tool("train", name, a, b)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                # The layout: the keys and param_groups Python's own save writes.
                model, opt = make(name)
                step(model, opt, 1)
                ref = os.path.join(self.dir, f"py_{name}_ref")
                save(model, opt, ref)
                cpp_md = dcp.FileSystemReader(a).read_metadata().state_dict_metadata
                py_md = dcp.FileSystemReader(ref).read_metadata().state_dict_metadata
                self.assertEqual(list(cpp_md), list(py_md))  # same keys, in Python's order
                cpp_all, py_all = (os.path.join(self.dir, f"{n}_{name}.pt") for n in ("c", "p"))
                dcp_to_torch_save(a, cpp_all)
                dcp_to_torch_save(ref, py_all)
                # dcp_to_torch_save rebuilds every nested dict in the same order.
                self.assertEqual(key_tree(torch.load(cpp_all)), key_tree(torch.load(py_all)))
                cpp_groups = torch.load(cpp_all)["optim"]["param_groups"]
                py_groups = torch.load(py_all)["optim"]["param_groups"]
                self.assertEqual(len(cpp_groups), 1)
                self.assertEqual(set(cpp_groups[0]), set(py_groups[0]))
                for k, v in py_groups[0].items():
                    self.assertEqual(cpp_groups[0][k], v, k)
                    self.assertIs(type(cpp_groups[0][k]), type(v), k)
                cpp_state = torch.load(cpp_all)["optim"]["state"]
                py_state = torch.load(py_all)["optim"]["state"]
                for fqn, s in py_state.items():
                    for k, v in s.items():
                        got = cpp_state[fqn][k]
                        self.assertEqual((got.dtype, got.shape), (v.dtype, v.shape), f"{fqn}.{k}")
                # The meaning: Python resumes A and arrives at B.
                model, opt = make(name)
                load(model, opt, a)
                step(model, opt, 4)
                want_model, want_opt = make(name)
                load(want_model, want_opt, b)
                got, want = flat(model, opt), flat(want_model, want_opt)
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    torch.testing.assert_close(got[k].double(), want[k].double(), rtol=1e-5,
                                               atol=1e-7, msg=f"{name}: {k}")

    def test_python_checkpoints_resume_in_cpp(self):
        for name in OPTIMIZERS:
            with self.subTest(optimizer=name):
                a, b = (os.path.join(self.dir, f"py_{name}_{s}") for s in "ab")
                model, opt = make(name)
                for i in (1, 2, 3):
                    step(model, opt, i)
                save(model, opt, a)
                step(model, opt, 4)
                save(model, opt, b)
                proc = self.tool("resume", name, a, b)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("compared", proc.stdout)
                print(f"{name}: {proc.stdout.strip()}", flush=True)


if __name__ == "__main__":
    unittest.main()
