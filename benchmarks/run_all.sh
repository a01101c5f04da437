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

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
peer() {
  if "${PYTHON:-python3}" "$here/peers/pytorch_cifar10.py" --threads 1 2 >"$1" 2>/dev/null; then :; else : >"$1"; fi
}

# The flagship's throughput, cohort's and PyTorch's, in two alternating rounds, the best of each kept: timing
# on a shared machine drifts by tens of percent within minutes, and alternating exposes both to the same drift.
"$bench" --benchmark_out="$scratch/cohort1.json" --benchmark_out_format=json
peer "$scratch/peer1.txt"
for threads in 1 2; do "$profile" "$threads"; echo; done
"$bench" --benchmark_filter=Flagship --benchmark_out="$scratch/cohort2.json" --benchmark_out_format=json >/dev/null
peer "$scratch/peer2.txt"

python3 - "$scratch" <<'PY'
import glob, json, re, sys
# cohort's mixed_bfloat16 rows stand beside PyTorch's bfloat16 autocast.
PRECISIONS = ["float32", "bfloat16"]
training, inference = {}, {}
peer_training, peer_inference = {}, {}


def keep_best(table, key, value):
    table[key] = max(table.get(key, 0.0), value)


for path in sorted(glob.glob(sys.argv[1] + "/cohort*.json")):
    for r in json.load(open(path))["benchmarks"]:
        m = re.match(r"BM_FlagshipTrainStep/threads:(\d+)/bf16:(\d)", r["name"])
        if m:
            keep_best(training, (PRECISIONS[int(m.group(2))], int(m.group(1))), r["images/s"])
        m = re.match(r"BM_FlagshipPredict/batch:(\d+)/threads:(\d+)/bf16:(\d)", r["name"])
        if m:
            keep_best(inference, (PRECISIONS[int(m.group(3))], int(m.group(1)), int(m.group(2))), r["images/s"])
for path in sorted(glob.glob(sys.argv[1] + "/peer*.txt")):
    for line in open(path):
        m = re.match(r"pytorch precision=(\w+) threads=(\d+) images/s=([\d.]+)", line)
        if m:
            keep_best(peer_training, (m.group(1), int(m.group(2))), float(m.group(3)))
        m = re.match(r"pytorch precision=(\w+) predict batch=(\d+) threads=(\d+) images/s=([\d.]+)", line)
        if m:
            keep_best(peer_inference, (m.group(1), int(m.group(2)), int(m.group(3))), float(m.group(4)))


def table(title, key_names, ours, theirs):
    print(f"\n{title}")
    print("".join(f"{name:>10}" for name in key_names) + f" {'cohort':>10} {'pytorch':>10} {'ratio':>8}")
    for key in sorted(ours):
        peer = theirs.get(key)
        ratio = f"{ours[key] / peer:.2f}x" if peer else "n/a"
        keys = key if isinstance(key, tuple) else (key,)
        print("".join(f"{k:>10}" for k in keys) + f" {ours[key]:>10.1f} {peer if peer else float('nan'):>10.1f} {ratio:>8}")


print("\n(best of two alternating rounds each)")
table("flagship CIFAR-10 CNN, batch 128, forward + backward + Adam (images/s; bfloat16: cohort mixed_bfloat16, "
      "PyTorch autocast)", ["precision", "threads"], training, peer_training)
table("flagship CIFAR-10 CNN, inference: Sequential::infer, as predict() (images/s)", ["precision", "batch", "threads"],
      inference, peer_inference)
if not peer_training:
    print("(PyTorch not found: make bench installs it into .venv-peers, or PYTHON=... names an interpreter with torch)")
PY
