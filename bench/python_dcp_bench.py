"""Python DCP's side of the benchmark harness (bench/run_bench.sh): the same states as
bench/bench_state.h ("model": a transformer-like model with Adam state; "small": 20,000 small
tensors plus 4 large ones, no optimizer state; every tensor row-sharded as DTensor Shard(0)),
saved or loaded by torch.distributed.checkpoint on N gloo processes.

    python python_dcp_bench.py save|load <dir> <MiB> <processes> [model|small]

Before a load, the checkpoint's files are evicted from the page cache. Prints one line:
    RESULT op=... ranks=N bytes=B seconds=S read_bytes=R peak_rss_overhead_mib=M
(R: bytes read through read(2) by all processes, /proc/self/io rchar; M: the largest growth of
a process's peak RSS during the operation beyond its state.)"""
import os
import resource
import socket
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def model_specs(mib):
    d, vocab = 1024, 8192
    per_layer_mib = (12 * d * d + 2 * d) * 4 * 3 // (1024 * 1024)
    layers = max(1, (mib - vocab * d * 4 * 3 // (1024 * 1024)) // per_layer_mib)
    specs = [("embed.weight", (vocab, d))]
    for i in range(layers):
        p = f"layers.{i}."
        specs += [(p + "attn.qkv.weight", (3 * d, d)), (p + "attn.out.weight", (d, d)),
                  (p + "mlp.up.weight", (4 * d, d)), (p + "mlp.down.weight", (d, 4 * d)),
                  (p + "norm1.weight", (d,)), (p + "norm2.weight", (d,))]
    return specs


def small_specs():  # bench_state.h's small_specs()
    specs = [(f"layers.{i // 10}.p{i % 10}", (256 * (1 + (i * 7919) % 64),)) for i in range(20000)]
    return specs + [(f"large.{i}", (2048, 4096)) for i in range(4)]


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") // 1024


def worker(rank, world, port, op, path, mib, kind, out):
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    nbytes = 0

    def shard(shape):
        nonlocal nbytes
        # Build only the local shard (a full random tensor per rank would not fit the memory).
        full = torch.empty(shape, device="meta")
        dt = distribute_tensor(full, mesh, [Shard(0)])
        local = torch.zeros(dt.to_local().shape) if op == "load" else torch.randn(dt.to_local().shape)
        nbytes += local.numel() * 4
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())

    model, optim = {}, {}
    for name, shape in (small_specs() if kind == "small" else model_specs(mib)):
        model[name] = shard(shape)
        if kind != "small":
            optim[name] = {"exp_avg": shard(shape), "exp_avg_sq": shard(shape)}
    state = {"model": model, "step": 1000}
    if kind != "small":
        state["optim"] = {"state": optim}
    if op == "load" and rank == 0:
        for name in os.listdir(path):
            fd = os.open(os.path.join(path, name), os.O_RDONLY)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    dist.barrier()
    base = max(rss_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    r0 = rchar()
    t0 = time.perf_counter()
    if op == "save":
        dcp.save(state, checkpoint_id=path)
    else:
        dcp.load(state, checkpoint_id=path)
    dist.barrier()
    seconds = time.perf_counter() - t0
    overhead = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
    stats = torch.tensor([nbytes, rchar() - r0, overhead], dtype=torch.float64)
    gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, stats)
    if rank == 0:
        total = sum(g[0].item() for g in gathered)
        read = sum(g[1].item() for g in gathered)
        over = max(g[2].item() for g in gathered) / 1024.0
        out.put(f"RESULT op={op} ranks={world} bytes={int(total)} seconds={seconds:.4f} "
                f"read_bytes={int(read)} peak_rss_overhead_mib={over:.1f}")
    dist.destroy_process_group()


def main():
    op, path, mib, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kind = sys.argv[5] if len(sys.argv) > 5 else "model"
    if kind not in ("model", "small"):
        sys.exit(f"python_dcp_bench.py: unknown state '{kind}'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, op, path, mib, kind, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit(1)
    print(out.get())


if __name__ == "__main__":
    main()
