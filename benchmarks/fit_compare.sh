#!/usr/bin/env bash
# fit() end to end: cohort's Fashion-MNIST example (real data read from its idx files, normalized on the way,
# shuffled each epoch, validated after each) beside the same network as a PyTorch training loop over a
# DataLoader (benchmarks/peers/pytorch_fashion_mnist.py), on one device, in the same run: the training images/s
# of the last epoch (validation left out on both sides) and the test accuracy. On a GPU cohort runs twice: its
# batches copied as 8-bit images, and with the training set resident there (--resident-images).
#   usage: benchmarks/fit_compare.sh [BUILD_DIR] [DEVICE] [EPOCHS] [BATCH] [DATA_DIR]
#   DEVICE: cpu or cuda; DATA_DIR: the idx files (Debian's dataset-fashion-mnist unless given); PYTHON=... picks
#   the interpreter with torch
set -euo pipefail
build=${1:-build}
device=${2:-cpu}
epochs=${3:-2}
batch=${4:-256}
data=${5:-/usr/share/datasets/fashion-mnist}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
example=$build/examples/fashion_mnist
[ -x "$example" ] || { echo "fit_compare: $example not built" >&2; exit 2; }
case $device in cpu | cuda) ;; *) echo "fit_compare: device '$device' is neither cpu nor cuda" >&2; exit 2 ;; esac

history=$(mktemp)
trap 'rm -f "$history"' EXIT
# One run of the example with these further options: "images/s test-accuracy" of its last epoch.
ours() {
  "$example" --device "$device" --epochs "$epochs" --batch-size "$batch" --data-dir "$data" --history-csv "$history" \
    "$@" >/dev/null
  awk -F, 'NR == 1 {for (i = 1; i <= NF; ++i) column[$i] = i; next}
           {speed = $column["samples_per_second"]; accuracy = $column["val_accuracy"]}
           END {printf "%.1f %.4f", speed, accuracy}' "$history"
}
read -r our_speed our_accuracy <<<"$(ours)"
# On a GPU also with the training set kept there, batches bringing only sample indices.
if [ "$device" = cuda ]; then read -r resident_speed resident_accuracy <<<"$(ours --resident-images)"; fi
theirs=$("$python" "$here/peers/pytorch_fashion_mnist.py" --device "$device" --epochs "$epochs" --batch-size "$batch" \
  --data-dir "$data") ||
  theirs=""
echo
echo "Fashion-MNIST, fit() end to end on $device: batch $batch, $epochs epochs, the last epoch's training images/s"
printf '%-28s %12s %14s\n' who "images/s" "test accuracy"
printf '%-28s %12s %14s\n' "cohort fit()" "$our_speed" "$our_accuracy"
if [ "$device" = cuda ]; then
  printf '%-28s %12s %14s\n' "cohort fit(), resident images" "$resident_speed" "$resident_accuracy"
fi
if [ -n "$theirs" ]; then
  their_speed=$(sed -n 's/.*train_images\/s=\([0-9.]*\).*/\1/p' <<<"$theirs")
  their_accuracy=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' <<<"$theirs")
  printf '%-28s %12s %14s\n' "PyTorch loop + DataLoader" "$their_speed" "$their_accuracy"
  awk -v a="$our_speed" -v b="$their_speed" 'BEGIN {printf "cohort / PyTorch: %.2fx\n", a / b}'
else
  echo "(no PyTorch numbers: see the PyTorch script's message above)"
fi
