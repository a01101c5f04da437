#!/usr/bin/env python3
"""cohort's Fashion-MNIST example as a PyTorch training loop: the same small CNN (two blocks of 3x3
convolution, batch normalization, ReLU and 2x2 max pooling; 128 units with dropout 0.3; 10 classes), the
same data read from the same idx files, normalized with the training set's mean and standard deviation,
served by a DataLoader that shuffles each epoch, Adam with its rate decaying along a cosine to 0 at the run's
end (the example's schedule), and the loss read back every step as a logging loop does (and as cohort's
fit() does). Prints the training throughput of the last epoch, the validation left out:
    pytorch device=cuda batch=256 train_images/s=X test_accuracy=A
"""
import argparse
import gzip
import os
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
except ImportError:
    print("pytorch: not installed on this host (pip install torch)", file=sys.stderr)
    sys.exit(3)


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(directory, split):
    def path(kind):
        for suffix in (".gz", ""):
            candidate = os.path.join(directory, f"{split}-{kind}-idx{1 if kind == 'labels' else 3}-ubyte{suffix}")
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(f"no {split} {kind} in {directory}")
    return read_idx(path("images")).float().div_(255).unsqueeze(1), read_idx(path("labels")).long()


def model():
    layers, channels = [], 1
    for filters in (32, 64):
        layers += [nn.Conv2d(channels, filters, 3, padding=1), nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01),
                   nn.ReLU(), nn.MaxPool2d(2)]
        channels = filters
    layers += [nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10)]
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    args = parser.parse_args()
    device = torch.device(args.device)
    train_images, train_labels = load(args.data_dir, "train")
    test_images, test_labels = load(args.data_dir, "t10k")
    mean, std = train_images.mean(), train_images.std()
    train_images, test_images = (train_images - mean) / std, (test_images - mean) / std
    loader = DataLoader(TensorDataset(train_images, train_labels), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, pin_memory=device.type == "cuda", persistent_workers=args.workers > 0)
    torch.manual_seed(0)
    net = model().to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader), eta_min=0.0)
    loss_fn = nn.CrossEntropyLoss()
    images_per_second = 0.0
    for _ in range(args.epochs):
        net.train()
        seen, start = 0, time.perf_counter()
        for images, labels in loader:
            images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(images), labels)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss.item()
            seen += len(labels)
        images_per_second = seen / (time.perf_counter() - start)
    net.eval()
    with torch.inference_mode():
        predictions = net(test_images.to(device).contiguous(memory_format=torch.channels_last)).argmax(1).cpu()
    accuracy = (predictions == test_labels).float().mean().item()
    print(f"pytorch device={device.type} batch={args.batch_size} train_images/s={images_per_second:.1f} "
          f"test_accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
