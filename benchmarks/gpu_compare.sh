#!/usr/bin/env bash
# The flagship CIFAR-10 CNN on one GPU, cohort beside PyTorch (eager, and torch.compile when it works) in
# the same run: training and inference images/s at batch 128 and 512, as one table.
#   usage: benchmarks/gpu_compare.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
build=${1:-build}
seconds=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/benchmarks/flagship_throughput
[ -x "$bench" ] || { echo "gpu_compare: $bench not built" >&2; exit 2; }

results=$(mktemp) peer_errors=$(mktemp)
trap 'rm -f "$results" "$peer_errors"' EXIT
# FP32 on both sides: TF32 only when asked for, and not here.
for batch in 128 512; do env -u COHORT_ALLOW_TF32 "$bench" --device cuda --batch "$batch" --seconds "$seconds" >>"$results"; done
python3 "$here/peers/pytorch_flagship_gpu.py" --seconds "$seconds" >>"$results" 2>"$peer_errors" || true
cat "$peer_errors" >&2

python3 - "$results" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(cohort|pytorch)(?: device=cuda| mode=(\w+)) batch=(\d+) train_images/s=([\d.]+) inference_images/s=([\d.]+)", line)
    if m:
        name = m.group(1) if m.group(1) == "cohort" else f"pytorch {m.group(2)}"
        rows.setdefault(int(m.group(3)), {})[name] = (float(m.group(4)), float(m.group(5)))
print("\nflagship CIFAR-10 CNN on one GPU, FP32 (images/s; ratio = cohort / peer)")
print(f"{'batch':>6} {'who':>16} {'train':>10} {'inference':>10} {'train ratio':>12} {'infer ratio':>12}")
for batch in sorted(rows):
    ours = rows[batch].get("cohort")
    for who, (train, infer) in sorted(rows[batch].items()):
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else ""
        tr = ratio(ours[0], train) if ours and who != "cohort" else ""
        ir = ratio(ours[1], infer) if ours and who != "cohort" else ""
        print(f"{batch:>6} {who:>16} {train:>10.0f} {infer:>10.0f} {tr:>12} {ir:>12}")
if not any(k != "cohort" for r in rows.values() for k in r):
    print("(no PyTorch numbers: see the PyTorch script's message above)")
print("cohort: deterministic cuDNN algorithms preferred, loss read back every step; "
      "PyTorch: cudnn.benchmark, loss.item() every step")
PY
