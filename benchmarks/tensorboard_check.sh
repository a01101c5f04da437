#!/usr/bin/env bash
# The event files of --tensorboard, read by TensorBoard itself (the PyPI package, into .venv-peers unless
# PYTHON names an interpreter that has it): a short Fashion-MNIST run on 2 workers under cohort-launch,
# then every epoch scalar compared with the run's history CSV, and the histograms counted.
#   usage: [PYTHON=python-with-tensorboard] benchmarks/tensorboard_check.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
for binary in "$build/cohort-launch" "$build/examples/fashion_mnist"; do
  [ -x "$binary" ] || { echo "tensorboard_check: $binary not built" >&2; exit 2; }
done
python=${PYTHON:-.venv-peers/bin/python}
if ! "$python" -c 'import tensorboard' 2>/dev/null; then
  python3 -m venv .venv-peers && .venv-peers/bin/pip install -q tensorboard
  python=.venv-peers/bin/python
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
timeout 600 "$build/cohort-launch" --workers 2 -- "$build/examples/fashion_mnist" --train-samples 4000 --epochs 3 \
  --threads 1 --verbosity epochs --tensorboard "$scratch/logs" --tensorboard-every 20 --history-csv "$scratch/history.csv"
"$python" "$here/peers/tensorboard_read.py" "$scratch/logs" "$scratch/history.csv"
echo "open them with: tensorboard --logdir DIR (the --tensorboard directory)"
