#!/usr/bin/env bash
# One command for the parameter-server picture on this machine:
#  1. push+pull throughput of one server (cohort_ps_bench) over TCP beside the loopback TCP ceiling
#     (iperf3), and over shared memory;
#  2. training throughput of the flagship CIFAR-10 CNN (batch 128 per worker) on 1 process and on
#     2 workers + 2 parameter servers (cohort-launch, Sync), with the chief's time communicating per step;
#  3. the same 2 + 2 run with TensorFlow's parameter servers (benchmarks/peers/tensorflow_ps_cifar10.py),
#     and the ratio. CIFAR-shaped data: a generated CIFAR-10 binary set of random images for cohort,
#     random tensors made on the workers for TensorFlow.
#   usage: benchmarks/ps_compare.sh [BUILD_DIR] [STEPS]     (PYTHON=... picks the interpreter with tensorflow-cpu)
set -uo pipefail
build=${1:-build}
steps=${2:-60}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for binary in cohort_ps_bench; do
  [ -x "$build/benchmarks/$binary" ] || { echo "ps_compare: build first (make bench-ps)" >&2; exit 2; }
done
cores=$(nproc)

echo "== push+pull of one parameter server (loopback TCP, TLS, then shared memory)"
"$build/benchmarks/cohort_ps_bench" || exit 1
"$build/benchmarks/cohort_ps_bench" --tls || exit 1
"$build/benchmarks/cohort_ps_bench" --shared-memory || exit 1
if command -v iperf3 >/dev/null; then
  port=$(( 20000 + RANDOM % 20000 ))
  iperf3 -s -1 -B 127.0.0.1 -p $port >/dev/null 2>&1 &
  sleep 0.5
  echo "loopback TCP ceiling (iperf3, one stream): $(iperf3 -c 127.0.0.1 -p $port -t 3 -f G 2>/dev/null | awk '/receiver/ {print $(NF-2)}') GB/s"
  wait
fi

data="$out/cifar"
python3 "$here/random_cifar10.py" "$data"
run_args=(--data-dir "$data" --max-steps "$steps" --batch-size 128)
echo
echo "== flagship CIFAR-10 CNN training, batch 128 per worker, $steps steps, $cores cores"
"$build/examples/cifar10" "${run_args[@]}" --threads "$cores" >"$out/single" 2>&1 || { cat "$out/single"; exit 1; }
"$build/cohort-launch" --workers 2 --ps 2 -- "$build/examples/cifar10" "${run_args[@]}" >"$out/ps" 2>&1 || { cat "$out/ps"; exit 1; }
tf_rate=""
if "$python" -c "import tensorflow" 2>/dev/null; then
  "$python" "$here/peers/tensorflow_ps_cifar10.py" --workers 2 --ps 2 --mode sync --steps "$steps" --threads $(( cores / 2 > 0 ? cores / 2 : 1 )) \
    >"$out/tf" 2>"$out/tf.err" || { echo "(TensorFlow run failed; see below)"; tail -5 "$out/tf.err"; }
  tf_rate=$(sed -n 's/.*images\/s=\([0-9.]*\).*/\1/p' "$out/tf" | tail -1)
else
  echo "(TensorFlow not installed for $python: pip install tensorflow-cpu, then PYTHON=... make bench-ps)"
fi

python3 - "$out/single" "$out/ps" "$tf_rate" <<'PY'
import re, sys
def images_per_second(path):
    rates = re.findall(r"final: .* ([\d.]+) images/s", open(path).read())
    return float(rates[-1]) if rates else float("nan")
single = images_per_second(sys.argv[1])
text = open(sys.argv[2]).read()
# The chief's own rate; in Sync every worker takes the same steps on an equal share, so the cluster's rate
# is twice it.
cluster = 2 * images_per_second(sys.argv[2])
comm = re.findall(r"chief: ([\d.]+) s communicating over (\d+) steps, ([\d.]+) ms per step", text)
tf = float(sys.argv[3]) if sys.argv[3] else None
print(f"{'setup':<44} {'images/s':>10}")
print(f"{'cohort, 1 process':<44} {single:>10.1f}")
print(f"{'cohort, 2 workers + 2 ps (sync)':<44} {cluster:>10.1f}   ({cluster / single:.2f}x one process)")
if comm:
    seconds, count, per_step = comm[-1]
    print(f"   chief communicating: {per_step} ms per step ({seconds} s over {count} steps)")
if tf:
    print(f"{'TensorFlow, 2 workers + 2 ps (sync)':<44} {tf:>10.1f}")
    print(f"cohort / TensorFlow, 2 workers + 2 ps: {cluster / tf:.2f}x")
PY
