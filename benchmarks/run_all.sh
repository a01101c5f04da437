#!/usr/bin/env bash
# One command for the CPU performance picture: SGEMM of each GEMM path, per-layer convolution GFLOP/s,
# and the flagship model's training and inference throughput beside PyTorch's from the same run.
#   usage: [PYTHON=python-with-torch] benchmarks/run_all.sh [BUILD_DIR]        (make bench)
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/benchmarks/cohort_bench profile=$build/benchmarks/cohort_layer_profile
for binary in "$bench" "$profile"; do
  [ -x "$binary" ] || { echo "run_all: $binary not built (cmake --build $build --target cohort_bench cohort_layer_profile)" >&2; exit 2; }
done

json=$(mktemp)
peer=$(mktemp)
trap 'rm -f "$json" "$peer"' EXIT
"$bench" --benchmark_out="$json" --benchmark_out_format=json

for threads in 1 2; do "$profile" "$threads"; echo; done

if "${PYTHON:-python3}" "$here/peers/pytorch_cifar10.py" --threads 1 2 >"$peer" 2>/dev/null; then :; else : >"$peer"; fi

python3 - "$json" "$peer" <<'PY'
import json, re, sys
results = json.load(open(sys.argv[1]))["benchmarks"]
training, inference = {}, {}
for r in results:
    m = re.match(r"BM_FlagshipTrainStep/threads:(\d+)", r["name"])
    if m:
        training[int(m.group(1))] = r["images/s"]
    m = re.match(r"BM_FlagshipPredict/batch:(\d+)/threads:(\d+)", r["name"])
    if m:
        inference[(int(m.group(1)), int(m.group(2)))] = r["images/s"]
peer_training, peer_inference = {}, {}
for line in open(sys.argv[2]):
    m = re.match(r"pytorch threads=(\d+) images/s=([\d.]+)", line)
    if m:
        peer_training[int(m.group(1))] = float(m.group(2))
    m = re.match(r"pytorch predict batch=(\d+) threads=(\d+) images/s=([\d.]+)", line)
    if m:
        peer_inference[(int(m.group(1)), int(m.group(2)))] = float(m.group(3))


def table(title, key_names, ours, theirs):
    print(f"\n{title}")
    print("".join(f"{name:>8}" for name in key_names) + f" {'cohort':>10} {'pytorch':>10} {'ratio':>8}")
    for key in sorted(ours):
        peer = theirs.get(key)
        ratio = f"{ours[key] / peer:.2f}x" if peer else "n/a"
        keys = key if isinstance(key, tuple) else (key,)
        print("".join(f"{k:>8}" for k in keys) + f" {ours[key]:>10.1f} {peer if peer else float('nan'):>10.1f} {ratio:>8}")


table("flagship CIFAR-10 CNN, batch 128, forward + backward + Adam (images/s)", ["threads"], training, peer_training)
table("flagship CIFAR-10 CNN, inference: eval-mode forward (images/s)", ["batch", "threads"], inference, peer_inference)
if not peer_training:
    print("(PyTorch not found: make bench installs it into .venv-peers, or PYTHON=... names an interpreter with torch)")
PY
