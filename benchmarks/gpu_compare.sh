#!/usr/bin/env bash
# The flagship CIFAR-10 CNN on one GPU, cohort beside PyTorch (eager, and torch.compile when it works) in
# the same run: training and inference images/s at batch 128, 512 and 1024 (BATCHES="..." picks others), one
# table per precision, cohort with its default deterministic convolution algorithms and with the fastest by
# timing (COHORT_DETERMINISTIC=0, as PyTorch's cudnn.benchmark, which the PyTorch rows use; the ratios compare
# those two), and the fastest once more op by op (without the replayed CUDA graphs), the TFLOP/s each achieves (2 FLOPs per multiply-add of the convolutions and products, 3 passes per
# training step) with its share of the GPU's dense peak for that precision (A100, H100 and H200 known), and the
# largest batch whose training step fits in the GPU's memory (flagship_throughput --largest-batch):
#   float32         strict FP32 on both sides (COHORT_ALLOW_TF32=0; PyTorch with TF32 off)
#   tf32            TF32 tensor cores for convolutions and products (cohort's default; PyTorch's allow_tf32)
#   mixed_bfloat16  float32 variables, layers in bfloat16 (cohort --precision; PyTorch's autocast)
#   usage: benchmarks/gpu_compare.sh [BUILD_DIR] [SECONDS] [PRECISION...]   (default: all three)
#   PYTORCH_MODES="eager compile" (the default) picks PyTorch's modes; torch.compile costs a compilation per
#   precision and batch. LARGEST_BATCH="tf32 ..." probes the largest batch for those precisions only (a dozen
#   training steps at large batches each; "all", the default, for every precision).
set -euo pipefail
build=${1:-build}
seconds=${2:-5}
shift $(($# < 2 ? $# : 2))
precisions=("$@")
[ ${#precisions[@]} -gt 0 ] || precisions=(float32 tf32 mixed_bfloat16)
read -r -a batches <<<"${BATCHES:-128 512 1024}"
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/benchmarks/flagship_throughput
[ -x "$bench" ] || { echo "gpu_compare: $bench not built" >&2; exit 2; }

results=$(mktemp) peer_errors=$(mktemp)
trap 'rm -f "$results" "$peer_errors"' EXIT
for precision in "${precisions[@]}"; do
  case $precision in
    float32) cohort=(env COHORT_ALLOW_TF32=0 "$bench") ;;
    tf32) cohort=(env COHORT_ALLOW_TF32=1 "$bench") ;;
    mixed_bfloat16) cohort=(env COHORT_ALLOW_TF32=0 "$bench" --precision mixed_bfloat16) ;;
    *) echo "gpu_compare: unknown precision '$precision' (float32, tf32, mixed_bfloat16)" >&2; exit 2 ;;
  esac
  for batch in "${batches[@]}"; do
    "${cohort[@]}" --device cuda --batch "$batch" --seconds "$seconds" | sed "s/precision=[a-z0-9_]*/precision=$precision/" >>"$results"
    COHORT_DETERMINISTIC=0 "${cohort[@]}" --device cuda --batch "$batch" --seconds "$seconds" |
      sed -e "s/precision=[a-z0-9_]*/precision=$precision/" -e 's/^cohort /cohort-fastest /' >>"$results"
    COHORT_DETERMINISTIC=0 "${cohort[@]}" --device cuda --batch "$batch" --seconds "$seconds" --no-capture |
      sed -e "s/precision=[a-z0-9_]*/precision=$precision/" -e 's/^cohort /cohort-op-by-op /' >>"$results"
  done
  if [ "${LARGEST_BATCH:-all}" = all ] || [[ " ${LARGEST_BATCH:-} " == *" $precision "* ]]; then
    "${cohort[@]}" --device cuda --largest-batch --batch 1024 | sed "s/precision=[a-z0-9_]*/precision=$precision/" >>"$results"
  fi
done
read -r -a modes <<<"${PYTORCH_MODES:-eager compile}"
python3 "$here/peers/pytorch_flagship_gpu.py" --seconds "$seconds" --precisions "${precisions[@]}" --modes "${modes[@]}" \
  --batch-sizes "${batches[@]}" \
  >>"$results" 2>"$peer_errors" || true
cat "$peer_errors" >&2

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
python3 - "$results" "$gpu" "${precisions[@]}" <<'PY'
import re, sys
# Dense peaks in TFLOP/s (no sparsity): float32 on CUDA cores, TF32 and bfloat16 on tensor cores.
PEAKS = [("H200", (67, 495, 989)), ("H100 PCIe", (51, 378, 756)), ("H100", (67, 495, 989)), ("A100", (19.5, 156, 312))]
gpu = sys.argv[2]
peak = next((p for name, p in PEAKS if name in gpu), None)
peak_of = {"float32": 0, "tf32": 1, "mixed_bfloat16": 2}
rows, flops_per_image = {}, {}
for line in open(sys.argv[1]):
    f = re.search(r"train_images/s=([\d.]+) inference_images/s=([\d.]+) train_tflop/s=([\d.]+) inference_tflop/s=([\d.]+)", line)
    if f and float(f.group(1)) > 0 and float(f.group(2)) > 0:
        flops_per_image = {"train": float(f.group(3)) * 1e12 / float(f.group(1)),
                           "inference": float(f.group(4)) * 1e12 / float(f.group(2))}
    m = re.match(r"(cohort-fastest|cohort-op-by-op|cohort|pytorch)(?: device=cuda| mode=(\w+)) precision=(\w+) batch=(\d+) "
                 r"train_images/s=([\d.]+) inference_images/s=([\d.]+)", line)
    if m:
        name = f"pytorch {m.group(2)}" if m.group(1) == "pytorch" else m.group(1).replace("-", " ")
        rows.setdefault((m.group(3), int(m.group(4))), {})[name] = (float(m.group(5)), float(m.group(6)))
def tflops(images, kind):
    if not flops_per_image:
        return ""
    achieved = images * flops_per_image[kind] * 1e-12
    share = f" ({achieved / peak[peak_of[precision]]:.1%})" if peak else ""
    return f"{achieved:.1f}{share}"
for precision in sys.argv[3:]:
    print(f"\nflagship CIFAR-10 CNN on one GPU ({gpu or 'unknown'}), {precision} (images/s; ratio = cohort fastest / "
          f"PyTorch; TFLOP/s with the share of the GPU's {'peak ' + str(peak[peak_of[precision]]) if peak else 'unknown peak'})")
    print(f"{'batch':>6} {'who':>16} {'train':>10} {'inference':>10} {'train ratio':>12} {'infer ratio':>12} "
          f"{'train TFLOP/s':>16} {'infer TFLOP/s':>16}")
    for (p, batch) in sorted(k for k in rows if k[0] == precision):
        ours = rows[(p, batch)].get("cohort fastest")
        for who, (train, infer) in sorted(rows[(p, batch)].items()):
            ratio = lambda a, b: f"{a / b:.2f}x" if a and b else ""
            peer = who.startswith("pytorch")
            tr = ratio(ours[0], train) if ours and peer else ""
            ir = ratio(ours[1], infer) if ours and peer else ""
            print(f"{batch:>6} {who:>16} {train:>10.0f} {infer:>10.0f} {tr:>12} {ir:>12} "
                  f"{tflops(train, 'train'):>16} {tflops(infer, 'inference'):>16}")
largest = [re.match(r"cohort device=cuda precision=(\w+) largest_batch=(\d+) step_peak_MiB=(\d+)", line)
           for line in open(sys.argv[1])]
for m in filter(None, largest):
    print(f"largest batch that trains in the GPU's memory, {m.group(1)}: {m.group(2)} (a step's peak {m.group(3)} MiB)")
if not any(k.startswith("pytorch") for r in rows.values() for k in r):
    print("(no PyTorch numbers: see the PyTorch script's message above)")
print("cohort: deterministic cuDNN algorithms; cohort fastest: timed ones (COHORT_DETERMINISTIC=0); both replay each "
      "step's capture (a CUDA graph), as fit() does; cohort op by op: the fastest without capture. All sum the loss "
      "on the GPU without reading it back per step. PyTorch: cudnn.benchmark. Ratios: cohort fastest / PyTorch")
PY
