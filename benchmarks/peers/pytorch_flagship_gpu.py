#!/usr/bin/env python3
"""The flagship CIFAR-10 CNN in PyTorch on one GPU, in eager mode and under torch.compile when it works:
training steps (forward, cross-entropy, backward, Adam, and the loss summed on the GPU without a read-back,
as cohort's fit() does between progress-bar redraws) and inference (eval mode, torch.inference_mode),
channels_last, cudnn.benchmark on (PyTorch's fastest setting; cohort prefers deterministic cuDNN
algorithms). Precisions: float32 (no TF32, as COHORT_ALLOW_TF32=0), tf32 (TF32 tensor cores for
convolutions and products, cohort's default), mixed_bfloat16 (torch.autocast to bfloat16 around the forward
pass and the loss, float32 parameters, as cohort's mixed_bfloat16 with COHORT_ALLOW_TF32=0). Prints one line per mode,
precision and batch:
    pytorch mode=eager precision=float32 batch=128 train_images/s=X inference_images/s=Y
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn as nn
    from pytorch_cifar10 import flagship_model
except ImportError:
    print("pytorch: not installed on this host (pip install torch)", file=sys.stderr)
    sys.exit(3)


def images_per_second(step, batch, seconds):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 5:
        step()
        steps += 1
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def measure(mode, precision, batch, seconds):
    torch.manual_seed(0)
    model = flagship_model().cuda().to(memory_format=torch.channels_last)
    runnable = torch.compile(model) if mode == "compile" else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.rand(batch, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    labels = torch.arange(batch, device="cuda") % 10

    autocast = precision == "mixed_bfloat16"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"

    loss_sum = torch.zeros((), device="cuda")

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(runnable(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum.add_(loss.detach())

    def inference_step():
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            runnable(images)

    model.train()
    train = images_per_second(train_step, batch, seconds)
    model.eval()
    inference = images_per_second(inference_step, batch, seconds)
    return train, inference


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--modes", nargs="+", default=["eager", "compile"])
    parser.add_argument("--precisions", nargs="+", default=["float32"], choices=["float32", "tf32", "mixed_bfloat16"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("pytorch: no CUDA device visible", file=sys.stderr)
        sys.exit(3)
    torch.backends.cudnn.benchmark = True
    print(f"pytorch {torch.__version__} on {torch.cuda.get_device_name()}", file=sys.stderr)
    for precision in args.precisions:
        for mode in args.modes:
            for batch in args.batch_sizes:
                try:
                    train, inference = measure(mode, precision, batch, args.seconds)
                except Exception as error:  # torch.compile needs a working compiler toolchain
                    print(f"pytorch mode={mode} precision={precision} batch={batch} failed: {error}".splitlines()[0],
                          file=sys.stderr)
                    continue
                print(f"pytorch mode={mode} precision={precision} batch={batch} train_images/s={train:.1f} "
                      f"inference_images/s={inference:.1f}", flush=True)


if __name__ == "__main__":
    main()
