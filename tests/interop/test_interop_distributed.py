"""Interop across world sizes against real Python DCP (torch 2.13, gloo on CPU, several
processes): DTensor checkpoints written by Python on 4 processes load in C++ on 3 ranks, and
checkpoints written by C++ on 6 ranks load in Python on 2 and 4 processes into DTensors, with
1-D and 2-D meshes both ways. Every value is compared bit for bit.

The C++ side is tests/mpi/mpi_tool.cpp (its state is tests/testing/sharded_state.cpp's
full_state(), which full_state() below mirrors). Run by ctest (labels 'interop' and 'mpi');
DCP_MPI_TOOL names the tool, DCP_MPIRUN the launcher."""
import os
import socket
import subprocess
import tempfile
import unittest
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from values import difference, make_tensor

MPI_TOOL = os.environ.get("DCP_MPI_TOOL", "")
INTEROP_TOOL = os.environ.get("DCP_INTEROP_TOOL", "")
MPIRUN = os.environ.get("DCP_MPIRUN", "mpirun")


def full_state():
    return {
        "model": {
            "embed": make_tensor(torch.float32, (10, 6), 1),
            "proj": make_tensor(torch.bfloat16, (17, 5), 2),
            "tiny": make_tensor(torch.int64, (3, 4), 3),
            "big": make_tensor(torch.float32, (64, 32), 4),
        },
        "replicated": make_tensor(torch.float32, (7, 3), 5),
        "step": 42,
        "lr": 0.5,
        "tags": ["a", "b"],
    }


MESHES = {
    "row": lambda world: ((world,), [Shard(0)]),
    "column": lambda world: ((world,), [Shard(1)]),
    "mesh2d": lambda world: ((2, world // 2), [Shard(0), Shard(1)]),
    "replicate_row": lambda world: ((2, world // 2), [Replicate(), Shard(0)]),
}


def sharded_state(layout, world, zeros):
    shape, placements = MESHES[layout](world)
    mesh = init_device_mesh("cpu", shape)
    full = full_state()
    model = {}
    for k, t in full["model"].items():
        src = torch.zeros_like(t) if zeros else t
        model[k] = distribute_tensor(src, mesh, placements)
    return {
        "model": model,
        "replicated": torch.zeros_like(full["replicated"]) if zeros else full["replicated"].clone(),
        "step": None if zeros else full["step"],
        "lr": None if zeros else full["lr"],
        "tags": None if zeros else full["tags"],
    }


def _worker(rank, world, port, action, layout, path, errors, finished):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if action == "save":
            dcp.save(sharded_state(layout, world, zeros=False), checkpoint_id=path)
        elif action == "save_local":  # no collectives: one __{rank}.metadata per rank
            dcp.save(sharded_state(layout, world, zeros=False), checkpoint_id=path,
                     use_collectives=False)
        elif action == "save_zstd":  # Python's ZStandard extension: every item compressed
            dcp.save(sharded_state(layout, world, zeros=False),
                     storage_writer=dcp.FileSystemWriter(path, _extensions=[ZStandard()]))
        else:
            sd = sharded_state(layout, world, zeros=True)
            dcp.load(sd, checkpoint_id=path)
            full = full_state()
            got = {"model": {k: v.full_tensor() for k, v in sd["model"].items()},
                   **{k: sd[k] for k in ("replicated", "step", "lr", "tags")}}
            diff = difference(full, got)
            if diff:
                errors.put(f"rank {rank}: {diff}")
        dist.barrier()
        finished.put(rank)  # the save or load and its check are complete
        finished.close()
        finished.join_thread()  # flushed before the teardown below can take the process down
    except Exception as e:  # reported to the parent, which fails the test
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def run_python(world, action, layout, path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    finished = ctx.Queue()
    procs = [ctx.Process(target=_worker,
                         args=(r, world, port, action, layout, path, errors, finished))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    done = set()
    while not finished.empty():
        done.add(finished.get())
    codes = [p.exitcode for p in procs]
    if messages or len(done) != world:
        raise AssertionError(f"python {action} on {world} processes failed: {messages} "
                             f"exit codes {codes}, ranks that finished: {sorted(done)}")
    if any(c != 0 for c in codes):
        # Every rank finished and checked its save or load; a process then died in
        # destroy_process_group (gloo's teardown, seen as SIGABRT under a loaded machine).
        print(f"WARNING: python {action} on {world} processes: every rank finished, then exit "
              f"codes {codes} in process-group teardown", flush=True)


def run_cpp(world, action, layout, path, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    cmd = [MPIRUN, "-np", str(world), "--oversubscribe", "--bind-to", "none", "--mca", "btl",
           "self,vader", MPI_TOOL, action, path, layout, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")


def check_decoders(path):
    """Every '.metadata' that Python wrote in `path` must take dcp's direct decoder and decode to
    what the object-tree decoder reads (interop_tool decoders)."""
    files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".metadata")]
    assert files, f"no .metadata in {path}"
    proc = subprocess.run([INTEROP_TOOL, "decoders", *files], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"interop_tool decoders failed:\n{proc.stdout}\n{proc.stderr}")


class PythonSavesCppLoads(unittest.TestCase):
    def setUp(self):
        self.assertTrue(MPI_TOOL, "DCP_MPI_TOOL is not set")
        self.assertTrue(INTEROP_TOOL, "DCP_INTEROP_TOOL is not set")

    def test_python_4_processes_shard0_uneven_to_cpp_3_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            run_python(4, "save", "row", d)
            check_decoders(d)
            run_cpp(3, "load", "row", d)
            run_cpp(1, "load", "row", d)
            run_cpp(4, "load", "column", d)

    def test_python_2d_mesh_to_cpp_3_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            run_python(4, "save", "mesh2d", d)
            check_decoders(d)
            run_cpp(3, "load", "row", d)

    def test_python_zstd_4_processes_to_cpp_3_ranks_resharded(self):
        with tempfile.TemporaryDirectory() as d:
            run_python(4, "save_zstd", "row", d)
            check_decoders(d)
            run_cpp(3, "load", "column", d)

    def test_python_without_collectives_4_processes_to_cpp_at_any_world_size(self):
        with tempfile.TemporaryDirectory() as d:
            run_python(4, "save_local", "row", d)
            names = sorted(os.listdir(d))
            self.assertNotIn(".metadata", names)
            self.assertEqual([n for n in names if n.endswith(".metadata")],
                             [f"__{r}.metadata" for r in range(4)])
            check_decoders(d)
            run_cpp(4, "load", "row", d)
            run_cpp(3, "load", "column", d)
            run_cpp(1, "load", "row", d)

    def test_python_replicated_mesh_dimension_to_cpp(self):
        with tempfile.TemporaryDirectory() as d:
            run_python(4, "save", "replicate_row", d)
            check_decoders(d)
            run_cpp(3, "load", "column", d)


class CppSavesPythonLoads(unittest.TestCase):
    def setUp(self):
        self.assertTrue(MPI_TOOL, "DCP_MPI_TOOL is not set")

    def test_cpp_6_ranks_to_python_2_processes(self):
        with tempfile.TemporaryDirectory() as d:
            run_cpp(6, "save", "row", d)
            run_python(2, "load", "row", d)
            run_python(2, "load", "column", d)

    def test_cpp_zstd_4_ranks_to_python_2_processes_resharded(self):
        with tempfile.TemporaryDirectory() as d:
            run_cpp(4, "save", "row", d, "zstd")
            run_python(2, "load", "column", d)

    def test_cpp_without_collectives_to_python_on_the_same_world_size(self):
        with tempfile.TemporaryDirectory() as d:
            run_cpp(4, "save", "row", d, "local")
            self.assertNotIn(".metadata", os.listdir(d))
            run_python(4, "load", "row", d)  # Python reads its own rank's __{rank}.metadata
            run_cpp(3, "load", "column", d)

    def test_cpp_2d_mesh_to_python_2d_and_1d(self):
        with tempfile.TemporaryDirectory() as d:
            run_cpp(6, "save", "mesh2d", d)
            run_python(4, "load", "mesh2d", d)
            run_python(2, "load", "row", d)


if __name__ == "__main__":
    unittest.main()
