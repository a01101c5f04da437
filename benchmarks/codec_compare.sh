#!/usr/bin/env bash
# Gradient codecs on real data: Fashion-MNIST (the Debian package dataset-fashion-mnist), 2 ring-allreduce
# workers under cohort-launch, one thread each, the same epochs and seed for every codec: the test accuracy,
# the wall time and the gradient bytes each run reduced, uncompressed against PowerSGD at ranks 1 and 4.
#   usage: benchmarks/codec_compare.sh [BUILD_DIR] [EPOCHS]
set -uo pipefail
build=${1:-build}
epochs=${2:-5}
for binary in examples/fashion_mnist cohort-launch; do
  [ -x "$build/$binary" ] || { echo "codec_compare: build first (make build)" >&2; exit 2; }
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== Fashion-MNIST, 2 workers x 1 thread, $epochs epochs, $(nproc) cores"
printf '%-12s %9s %9s  %s\n' codec accuracy seconds "gradient bytes"
for codec in none powersgd:1 powersgd:4; do
  started=$(date +%s%N)
  OMP_NUM_THREADS=1 "$build/cohort-launch" --workers 2 -- "$build/examples/fashion_mnist" --epochs "$epochs" --threads 1 \
    --verbosity epochs --gradient-codec "$codec" >"$log" 2>&1 || { tail -5 "$log"; exit 1; }
  milliseconds=$(( ($(date +%s%N) - started) / 1000000 ))
  accuracy=$(grep -o 'test accuracy: [0-9.]*' "$log" | tail -1 | cut -d' ' -f3)
  traffic=$(grep -o 'gradients: .*' "$log" | head -1 | sed 's/^gradients: //')
  printf '%-12s %9s %9s  %s\n' "$codec" "$accuracy" "$((milliseconds / 1000)).$((milliseconds % 1000 / 100))" "$traffic"
done
