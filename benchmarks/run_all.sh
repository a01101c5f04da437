#!/usr/bin/env bash
# One command for the CPU performance picture: SGEMM peak, per-layer convolution GFLOP/s, and the
# flagship model's training throughput beside PyTorch's from the same run.
#   usage: benchmarks/run_all.sh [BUILD_DIR]        (make bench)
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/benchmarks/cohort_bench
[ -x "$bench" ] || { echo "run_all: $bench not built (cmake --build $build --target cohort_bench)" >&2; exit 2; }

json=$(mktemp)
trap 'rm -f "$json"' EXIT
"$bench" --benchmark_out="$json" --benchmark_out_format=json

peer=$(mktemp)
if python3 "$here/peers/pytorch_cifar10.py" --threads 1 2 >"$peer" 2>/dev/null; then :; else : >"$peer"; fi

python3 - "$json" "$peer" <<'PY'
import json, re, sys
results = json.load(open(sys.argv[1]))["benchmarks"]
cohort = {}
for r in results:
    m = re.match(r"BM_FlagshipTrainStep/threads:(\d+)", r["name"])
    if m:
        cohort[int(m.group(1))] = r["images/s"]
peer = {}
for line in open(sys.argv[2]):
    m = re.match(r"pytorch threads=(\d+) images/s=([\d.]+)", line)
    if m:
        peer[int(m.group(1))] = float(m.group(2))
print("\nflagship CIFAR-10 CNN, batch 128, forward + backward + Adam (images/s)")
print(f"{'threads':>8} {'cohort':>10} {'pytorch':>10} {'ratio':>8}")
for threads in sorted(cohort):
    theirs = peer.get(threads)
    ratio = f"{cohort[threads] / theirs:.2f}x" if theirs else "n/a"
    print(f"{threads:>8} {cohort[threads]:>10.1f} {theirs if theirs else float('nan'):>10.1f} {ratio:>8}")
if not peer:
    print("(PyTorch not installed: pip install torch, or apt-get install python3-torch)")
PY
