#!/usr/bin/env bash
# A model trained by one program and saved with nn::save_model is served by another program that lacks
# its code (examples/predict): the same test accuracy from the raw test images; the flagship's model too.
#   usage: model_file_test.sh FASHION_MNIST_EXAMPLE PREDICT_EXAMPLE CIFAR10_EXAMPLE
set -uo pipefail
train=$1 predict=$2 flagship=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work/log" 2>/dev/null; exit 1; }
timeout 300 "$train" --epochs 1 --train-samples 3000 --batch-size 100 --verbosity epochs --save-model "$work/f.model" \
  >"$work/log" 2>&1 || fail "training failed"
trained=$(grep -o '^test accuracy: [0-9.]*' "$work/log" | grep -o '[0-9.]*$')
[ -n "$trained" ] || fail "the training run printed no test accuracy"
timeout 120 "$predict" "$work/f.model" >"$work/log" 2>&1 || fail "predict failed"
served=$(grep -o '^test accuracy: [0-9.]*' "$work/log" | grep -o '[0-9.]*$')
awk -v a="$trained" -v b="$served" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.5 && d <= 0.0005) }' ||
  fail "the served model's test accuracy $served differs from the trained one's $trained"
printf 'garbage' >"$work/bad.model"
"$predict" "$work/bad.model" >"$work/log" 2>&1
[ $? -eq 1 ] && grep -q 'model file' "$work/log" || fail "a foreign model file is not refused with a clear error"
COHORT_BF16_KERNELS=bogus "$predict" "$work/f.model" >"$work/log" 2>&1
[ $? -eq 2 ] && grep -q "COHORT_BF16_KERNELS='bogus'" "$work/log" || fail "predict accepted a misspelled COHORT_BF16_KERNELS"
# The flagship (on Fashion-MNIST without CIFAR-10) saves its model too, and predict serves it.
timeout 300 "$flagship" --epochs 1 --train-samples 1000 --batch-size 100 --verbosity epochs --save-model "$work/c.model" \
  >"$work/log" 2>&1 || fail "the flagship's training failed"
flagship_trained=$(grep -o 'test accuracy [0-9.]*' "$work/log" | tail -1 | grep -o '[0-9.]*$')
[ -f "$work/c.model" ] && [ -n "$flagship_trained" ] || fail "the flagship wrote no model file (or printed no test accuracy)"
timeout 120 "$predict" "$work/c.model" >"$work/log" 2>&1 || fail "predict failed on the flagship's model"
flagship_served=$(grep -o '^test accuracy: [0-9.]*' "$work/log" | grep -o '[0-9.]*$')
awk -v a="$flagship_trained" -v b="$flagship_served" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.0005) }' ||
  fail "the flagship's served model has test accuracy $flagship_served, trained $flagship_trained"
echo "model_file_test: trained $trained, served $served; the flagship trained $flagship_trained, served $flagship_served"
