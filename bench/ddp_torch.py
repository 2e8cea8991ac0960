#!/usr/bin/env python3
"""PyTorch's data parallelism on the workloads of bench/compare_torch.py, to set beside
`seam bench W --nproc N`: DistributedDataParallel over NCCL, one process a GPU, every rank
on a batch of the workload's size (the weak scaling seam bench times).

    python bench/ddp_torch.py W6 --nproc 8 --variants ddp_eager_fused ddp_compile_default

With --nproc it starts its ranks itself; under torchrun (`torchrun --nproc-per-node 8
bench/ddp_torch.py W6`) it is one of them. Variants:
  ddp_eager_fused      DDP (25 MB buckets, gradients as views of them), eager, fused optimizer;
  ddp_compile_default  that module under torch.compile (default mode: its DDPOptimizer cuts
                       the graph at the buckets so that their all-reduces overlap the backward);
  ddp_zero_fused       DDP with ZeroRedundancyOptimizer: each rank keeps the optimizer state
                       of 1/N of the parameters, as seam's --zero 1.
Models, optimizers, precision and clipping are compare_torch.py's. Rank 0 prints the
slowest rank's median ms/step, the ranks' samples/s together and the largest peak memory.
"""
import argparse
import csv
import inspect
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402

VARIANTS = ("ddp_eager_fused", "ddp_compile_default", "ddp_zero_fused")


def zero_optimizer(opt):
    """`opt` as a ZeroRedundancyOptimizer of its class: the same groups and settings."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls = type(opt)
    takes = inspect.signature(cls.__init__).parameters
    settings = {k: v for k, v in opt.defaults.items() if k in takes and k != "params"}
    groups = [{k: v for k, v in g.items() if k in ("params", "weight_decay")} for g in opt.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, **settings)


def step_of(variant, spec):
    model, opt, x, y = ct.make(spec, fused=True)
    ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()], bucket_cap_mb=25,
                                  gradient_as_bucket_view=True)
    if variant == "ddp_zero_fused":
        opt = zero_optimizer(opt)
    module = torch.compile(ddp) if variant == "ddp_compile_default" else ddp
    return ct.trainer(module, opt, x, y, spec)


def on_rank(a):
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        rows = []
        for w in a.workloads:
            spec = ct.WORKLOADS[w]
            ct.PRECISION = a.precision or spec.get("precision", "tf32")
            torch.backends.cuda.matmul.allow_tf32 = ct.PRECISION == "tf32"
            torch.backends.cudnn.allow_tf32 = ct.PRECISION == "tf32"
            for v in a.variants:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                ms, lo, hi = ct.timed(step_of(v, spec), a.steps, a.warmup, a.repeats)
                # The ranks wait for each other in every all-reduce: the slowest one's time is the run's.
                t = torch.tensor([ms, lo, hi, torch.cuda.max_memory_allocated() / 2**20], device="cuda")
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                ms, lo, hi, mib = t.tolist()
                samples = spec["batch"] * world / ms * 1e3
                if rank == 0:
                    print(f"{w} {v}+ranks{world} {ms:9.4f} ms/step ({lo:.4f}-{hi:.4f})  {samples:12.0f} samples/s "
                          f"({samples / world:.0f} a GPU)  peak {mib:8.1f} MiB", flush=True)
                rows.append(dict(framework="torch", workload=w, variant=f"{v}+ranks{world}", device="cuda",
                                 ms_per_step=ms, ms_min=lo, ms_max=hi, samples_per_s=samples,
                                 version=torch.__version__, precision=ct.PRECISION, memory_mib=mib))
        if rank == 0 and a.csv and rows:
            with open(a.csv, "w", newline="") as f:
                out = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                out.writeheader()
                out.writerows(rows)
    finally:
        dist.destroy_process_group()


def spawned(rank, world, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    on_rank(a)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="+", choices=list(ct.WORKLOADS))
    p.add_argument("--nproc", type=int, default=0, help="start this many ranks, one a GPU (not under torchrun)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default=None)
    p.add_argument("--csv", default="")
    a = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return on_rank(a)
    gpus = torch.cuda.device_count()
    if a.nproc < 1:
        p.error("--nproc N, or start the ranks with torchrun")
    if a.nproc > gpus:
        p.error(f"--nproc {a.nproc}: this host has {gpus} GPU(s); one rank a GPU")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {a.nproc} x {torch.cuda.get_device_name()}", flush=True)
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(spawned, args=(a.nproc, port, a), nprocs=a.nproc)


if __name__ == "__main__":
    main()
