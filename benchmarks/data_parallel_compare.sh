#!/usr/bin/env bash
# One command for data-parallel training speed on this machine: the flagship CIFAR-10 CNN at batch 128 per
# worker, one thread per process, on random CIFAR-shaped data:
#  1. cohort ring allreduce on 1, 2 and 4 workers (cohort-launch), plain and sharded (zero1, zero2, with the
#     optimizer state each rank kept), and 2 workers + 2 parameter servers (Sync): images/s of the cluster and
#     the exposed communication per step, from each run's timeline (benchmarks/timeline_summary.py: the
#     chief's main thread waiting for communication);
#  2. PyTorch DistributedDataParallel (gloo) on 2 processes x 1 thread in the same run
#     (benchmarks/peers/pytorch_ddp_cifar10.py), and the ratios.
#   usage: benchmarks/data_parallel_compare.sh [BUILD_DIR] [STEPS]   (PYTHON=... picks the interpreter with torch)
set -uo pipefail
build=${1:-build}
steps=${2:-40}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for binary in examples/cifar10 cohort-launch; do
  [ -x "$build/$binary" ] || { echo "data_parallel_compare: build first (make bench-data-parallel)" >&2; exit 2; }
done
python3 "$here/random_cifar10.py" "$out/cifar"
args=(--data-dir "$out/cifar" --max-steps "$steps" --batch-size 128 --threads 1 --verbosity silent)
cores=$(nproc)
export OMP_NUM_THREADS=1

# rate LABEL WORKERS TRACE: the cluster's images/s and the chief's exposed communication, from the timeline.
rate() {
  local summary
  summary=$(python3 "$here/timeline_summary.py" "$3") || { echo "$1: no timeline"; return; }
  python3 - "$1" "$2" "$summary" <<'PY'
import sys
label, workers, summary = sys.argv[1], int(sys.argv[2]), dict(kv.split("=") for kv in sys.argv[3].split())
step_ms = float(summary["step_ms"])
print(f"{label:<40} {128 * workers * 1000 / step_ms:>9.1f} images/s  step {step_ms:6.1f} ms  "
      f"exposed communication {float(summary['exposed_comm_ms']):5.1f} ms ({100 * float(summary['exposed_share']):.1f} %)")
PY
}

echo "== flagship CIFAR-10 CNN, batch 128 per worker, 1 thread per process, $steps steps, $cores cores"
"$build/examples/cifar10" "${args[@]}" --timeline "$out/w1.json" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
rate "cohort, 1 process" 1 "$out/w1.json" | tee "$out/rates"
for workers in 2 4; do
  for shard in none zero1 zero2; do
    label="cohort ring allreduce, $workers workers"
    [ "$shard" = none ] || label="cohort $shard, $workers workers"
    # Epoch verbosity, for the line of the optimizer state each rank kept.
    "$build/cohort-launch" --workers $workers -- "$build/examples/cifar10" "${args[@]/silent/epochs}" --shard-optimizer $shard \
      --timeline "$out/$shard$workers.json" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
    rate "$label" $workers "$out/$shard$workers.json" | tee -a "$out/rates"
    grep -o 'optimizer state per rank.*' "$out/log" | sed 's/^/    /'
  done
done
"$build/cohort-launch" --workers 2 --ps 2 -- "$build/examples/cifar10" "${args[@]}" --timeline "$out/ps.json" \
  >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
rate "cohort 2 workers + 2 ps (sync)" 2 "$out/ps.json" | tee -a "$out/rates"

if "$python" -c "import torch" 2>/dev/null; then
  "$python" "$here/peers/pytorch_ddp_cifar10.py" --workers 2 --threads 1 --steps "$steps" >"$out/ddp" 2>"$out/ddp.err" ||
    { echo "(DDP run failed)"; tail -5 "$out/ddp.err"; }
  cat "$out/ddp"
  python3 - "$out/rates" "$out/ddp" <<'PY'
import re, sys
rates = {line[:40].strip(): float(line[40:].split()[0]) for line in open(sys.argv[1])}
ddp = re.search(r"images/s=([\d.]+)", open(sys.argv[2]).read())
if ddp:
    ddp = float(ddp.group(1))
    print(f"cohort ring allreduce / DDP, 2 x 1 thread: {rates['cohort ring allreduce, 2 workers'] / ddp:.2f}x")
    print(f"cohort 2 + 2 ps / DDP, 2 x 1 thread:       {rates['cohort 2 workers + 2 ps (sync)'] / ddp:.2f}x")
PY
else
  echo "(PyTorch not installed for $python: PYTHON=... benchmarks/data_parallel_compare.sh)"
fi
