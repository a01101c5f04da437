#!/usr/bin/env python3
"""The flagship CIFAR-10 CNN in PyTorch on the CPU, in its fastest setting (channels_last, oneDNN,
threads set explicitly): one training step is forward, cross-entropy, backward and an Adam update at
batch 128, as in cohort's BM_FlagshipTrainStep; inference is the eval-mode forward pass under
torch.inference_mode at batch 128 and batch 1, as in BM_FlagshipPredict. Each in float32 and under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's mixed precision (float32 parameters, bfloat16
convolutions and products), as cohort's mixed_bfloat16 rows. Prints one line per measurement:
    pytorch precision=P threads=N images/s=X
    pytorch precision=P predict batch=B threads=N images/s=X
"""
import contextlib
import argparse
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("pytorch: not installed (pip install torch, or apt-get install python3-torch)", file=sys.stderr)
    sys.exit(3)


def flagship_model():
    layers = []
    channels = 3
    for filters, dropout in ((32, 0.2), (64, 0.3), (128, 0.4)):
        layers += [nn.Conv2d(channels, filters, 3, padding=1), nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01), nn.ReLU(),
                   nn.Conv2d(filters, filters, 3), nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01), nn.ReLU(),
                   nn.MaxPool2d(2), nn.Dropout(dropout)]
        channels = filters
    layers += [nn.Flatten(), nn.Linear(128 * 2 * 2, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def autocast(precision):
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def images_per_second(threads, batch, seconds, precision):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = flagship_model().to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()  # fused log-softmax + NLL, like cohort's fused loss
    images = torch.full((batch, 3, 32, 32), 0.5).contiguous(memory_format=torch.channels_last)
    labels = torch.arange(batch) % 10

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(3):  # warm-up: oneDNN primitive creation
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 5:
        step()
        steps += 1
    return steps * batch / (time.perf_counter() - start)


def predicted_images_per_second(threads, batch, seconds, precision):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = flagship_model().to(memory_format=torch.channels_last)
    model.eval()
    images = torch.full((batch, 3, 32, 32), 0.5).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast(precision):
        for _ in range(3):
            model(images)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or steps < 5:
            model(images)
            steps += 1
    return steps * batch / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    args = parser.parse_args()
    print(f"pytorch {torch.__version__} mkldnn={torch.backends.mkldnn.is_available()}", file=sys.stderr)
    for precision in args.precisions:
        for threads in args.threads:
            rate = images_per_second(threads, args.batch_size, args.seconds, precision)
            print(f"pytorch precision={precision} threads={threads} images/s={rate:.1f}", flush=True)
        for batch in (args.batch_size, 1):
            for threads in args.threads:
                rate = predicted_images_per_second(threads, batch, args.seconds / 2, precision)
                print(f"pytorch precision={precision} predict batch={batch} threads={threads} images/s={rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
