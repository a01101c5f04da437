#!/usr/bin/env python3
"""A CIFAR-10 binary set of random images in DIRECTORY: 5 x 2000 training records, 1000 test records."""
import os
import sys

directory = sys.argv[1]
os.makedirs(directory, exist_ok=True)
for name, n in [(f"data_batch_{i}.bin", 2000) for i in range(1, 6)] + [("test_batch.bin", 1000)]:
    with open(os.path.join(directory, name), "wb") as f:
        for _ in range(n):
            record = bytearray(os.urandom(3073))
            record[0] %= 10
            f.write(record)
