"""The Python half of the cross-language resume tests (test_resume.py): the model, data and
optimizers of examples/libtorch_train.cpp, trained with FSDP2 (fully_shard on a CPU mesh, gloo)
and checkpointed the way Python DCP's documentation does it: an AppState Stateful that calls
get_state_dict / set_state_dict, saved under "app", beside {"progress": {"step": n}}, into
<root>/step_<n> (the directory names of dcp::CheckpointManager).

    run(world, root, steps, optimizer, save_at=None, resume_from=None) -> {step: loss}
"""
import multiprocessing as mp
import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class AppState(Stateful):
    """Python DCP's documented pattern."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def build(world, optimizer):
    torch.manual_seed(1234)
    x = torch.randn(64, 16)
    y = torch.randn(64, 4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9)
    else:
        raise ValueError(optimizer)
    return model, opt, x, y


def _worker(rank, world, port, root, steps, optimizer, save_at, resume_from, results, errors):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, opt, x, y = build(world, optimizer)
        start = 1
        if resume_from is not None:
            state = {"app": AppState(model, opt), "progress": {"step": 0}}
            dcp.load(state, checkpoint_id=os.path.join(root, f"step_{resume_from}"))
            start = state["progress"]["step"] + 1
        losses = {}
        for step in range(start, steps + 1):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses[step] = loss.item()
            if save_at == step:
                dcp.save({"app": AppState(model, opt), "progress": {"step": step}},
                         checkpoint_id=os.path.join(root, f"step_{step}"))
        if rank == 0:
            results.put(losses)
        dist.barrier()
    except Exception as e:  # reported to the parent, which fails the test
        errors.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def run(world, root, steps, optimizer, save_at=None, resume_from=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results, errors = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, root, steps, optimizer, save_at,
                                               resume_from, results, errors))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    losses = None if results.empty() else results.get()
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    if messages or losses is None:
        raise AssertionError(f"python training on {world} processes failed: {messages}, exit "
                             f"codes {[p.exitcode for p in procs]}")
    return losses
