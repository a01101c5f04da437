#!/usr/bin/env python3
"""The flagship CIFAR-10 CNN trained with PyTorch DistributedDataParallel on the CPU (gloo backend over
127.0.0.1), as cohort's ring-allreduce run is measured: N processes x T threads, batch B per process,
Adam, channels_last. DDP's defaults (25 MiB buckets, overlapped allreduce). Prints the cluster's rate:
    pytorch-ddp workers=N threads=T images/s=X step_ms=Y
"""
import argparse
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
except ImportError:
    print("pytorch: not installed (pip install torch)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_cifar10 import flagship_model  # noqa: E402


def worker(rank, args, port, results):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.workers)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(flagship_model().to(memory_format=torch.channels_last))
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    images = torch.rand((args.batch_size, 3, 32, 32), generator=generator).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (args.batch_size,), generator=generator)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        optimizer.step()

    for _ in range(3):  # warm-up: oneDNN primitives, DDP's bucket rebuild after the first step
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        results.put(elapsed)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--port", type=int, default=29511)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(rank, args, args.port, results)) for rank in range(args.workers)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
        if p.exitcode != 0:
            print(f"pytorch-ddp: a worker exited with status {p.exitcode}", file=sys.stderr)
            sys.exit(1)
    elapsed = results.get()
    rate = args.steps * args.batch_size * args.workers / elapsed
    print(f"pytorch-ddp workers={args.workers} threads={args.threads} images/s={rate:.1f} "
          f"step_ms={1000 * elapsed / args.steps:.1f}", flush=True)


if __name__ == "__main__":
    main()
