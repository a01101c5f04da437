#!/usr/bin/env bash
# cohort-plan against measurement on this machine: the link measured by cohort's own allreduce between two
# processes, the compute profiled once, then for ring allreduce on 1, 2 and 4 workers and parameter servers
# 2+1, 2+2 and 4+2 (Fashion-MNIST's small CNN, batch 64, one thread each, under cohort-launch on loopback) the
# predicted step time beside the measured one (the chief's epoch line, training steps only), and whether
# the strategy the planner recommends for 4 workers is the fastest measured.
#   benchmarks/plan_check.sh [BUILD_DIR]      (about 10 minutes on 2 cores)
set -euo pipefail
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
samples=${PLAN_CHECK_SAMPLES:-12000}

# The link: t = 2 alpha + M/B for a 2-rank allreduce; alpha from 8 bytes, B from 1 MiB (best of three sweeps).
for round in 1 2 3; do
  "$build/cohort-launch" --workers 2 -- "$build/benchmarks/cohort_allreduce_bench" --min-bytes 8 --max-bytes 1048576 2>/dev/null |
    sed -n 's/^\[chief 0\] *\([0-9]*\) *[0-9]* *\([0-9.]*\) .*yes$/\1 \2/p' >"$work/sweep-$round"
done
read -r latency bandwidth < <(cat "$work"/sweep-* | awk '
  $1 == 8 && (small == "" || $2 < small) { small = $2 }
  $1 == 1048576 && (large == "" || $2 < large) { large = $2 }
  END { alpha = small / 2; printf "%.2fus %.0f\n", alpha, 1048576 / ((large - 2 * alpha) * 1e-6) }')
echo "link (shared memory on loopback, measured): latency $latency, bandwidth $bandwidth bytes/s; $cores cores"
"$build/cohort-plan" --model small_cnn --batch-size 64 --workers 1 --bandwidth "$bandwidth" --threads 1 \
  --profile-steps 20 --save-profile "$work/profile.json" >/dev/null

predicted() {  # WORKERS STRATEGY: its predicted ms per step
  "$build/cohort-plan" --model small_cnn --batch-size 64 --workers "$1" --bandwidth "$bandwidth" --latency "$latency" \
    --shared-cores "$cores" --profile "$work/profile.json" --json |
    python3 -c "import json, sys; d = json.load(sys.stdin); print('%.2f' % (1e3 * next(p['step_seconds'] for p in d['predictions'] if p['strategy'] == sys.argv[1])))" "$2"
}
measured() {  # LAUNCHER_ARGS...: the chief's ms per training step
  "$build/cohort-launch" "$@" -- "$build/examples/fashion_mnist" --train-samples "$samples" --epochs 1 --batch-size 64 \
    --threads 1 --verbosity lines --lr-scaling none 2>&1 |
    sed -n 's/^\[chief 0\] *[0-9]*\/[0-9]* \[=*\] - [0-9]*s \([0-9.]*\)\(m\?s\)\/step.*/\1 \2/p' | tail -1 |
    awk '{ print ($2 == "s" ? $1 * 1000 : $1) }'
}

printf "%-36s %12s %12s %8s\n" "setup" "predicted ms" "measured ms" "ratio"
best_measured="" best_measured_ms=""
row() {  # NAME WORKERS STRATEGY LAUNCHER_ARGS...
  local name=$1 workers=$2 strategy=$3
  shift 3
  local p m
  p=$(predicted "$workers" "$strategy")
  m=$(measured "$@")
  printf "%-36s %12s %12s %8s\n" "$name" "$p" "$m" "$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.2f", p / m }')"
  if [ "$workers" = 4 ] && { [ -z "$best_measured_ms" ] || awk -v m="$m" -v b="$best_measured_ms" 'BEGIN { exit !(m < b) }'; }; then
    best_measured=$strategy best_measured_ms=$m
  fi
  echo "$workers|$strategy|$m" >>"$work/measured"
}
row "1 worker" 1 "ring allreduce" --workers 1
row "ring allreduce, 2 workers" 2 "ring allreduce" --workers 2
row "ring allreduce, 4 workers" 4 "ring allreduce" --workers 4
row "parameter servers, 2 workers + 1" 2 "parameter servers (1, size-balanced)" --workers 2 --ps 1
row "parameter servers, 2 workers + 2" 2 "parameter servers (2, size-balanced)" --workers 2 --ps 2
row "parameter servers, 4 workers + 2" 4 "parameter servers (2, size-balanced)" --workers 4 --ps 2
recommended=$("$build/cohort-plan" --model small_cnn --batch-size 64 --workers 4 --max-servers 2 --bandwidth "$bandwidth" \
  --latency "$latency" --shared-cores "$cores" --profile "$work/profile.json" --json |
  python3 -c "import json, sys; print(json.load(sys.stdin)['recommended'])")
case $recommended in
  "ring allreduce" | "recursive doubling") family="ring allreduce" ;;  # one strategy: small buckets take recursive doubling
  "parameter servers (2, size-balanced)") family=$recommended ;;
  *) family="" ;;
esac
chosen_ms=$(grep "^4|$family|" "$work/measured" | cut -d'|' -f3)
echo "recommended for 4 workers: $recommended; fastest measured of the 4-worker runs: $best_measured ($best_measured_ms ms)"
if [ -n "$chosen_ms" ]; then
  awk -v c="$chosen_ms" -v b="$best_measured_ms" 'BEGIN { printf "the recommendation measured %.2f ms, %.2fx the fastest\n", c, c / b }'
else
  echo "the recommendation is none of the setups measured here"
fi
