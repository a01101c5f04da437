#!/usr/bin/env bash
# One command for the allreduce picture on this machine: cohort's ring allreduce beside Open MPI's
# MPI_Allreduce (its ob1 TCP path forced, so that all three use loopback TCP) and Gloo's ring allreduce, for
# 2 and 4 ranks, 4 KiB to 256 MiB, with the ratios, and the loopback TCP bandwidth (iperf3) as the ceiling.
# cohort's MPI communicator runs under the same mpirun settings as Open MPI's own benchmark.
# Peers that are not installed are skipped (Debian: openmpi-bin libopenmpi-dev libgloo-dev iperf3).
#   usage: benchmarks/allreduce_compare.sh [BUILD_DIR] [MAX_BYTES]
set -uo pipefail
build=${1:-build}
max=${2:-268435456}
bench=$build/benchmarks
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -x "$bench/cohort_allreduce_bench" ] || { echo "allreduce_compare: build first (make bench)" >&2; exit 2; }

for n in 2 4; do
  "$build/cohort-launch" --workers $n -- "$bench/cohort_allreduce_bench" --max-bytes "$max" >"$out/cohort.$n" 2>&1 \
    || { echo "cohort run on $n ranks failed:"; cat "$out/cohort.$n"; exit 1; }
  if [ -x "$bench/mpi_allreduce_bench" ] && command -v mpirun >/dev/null; then
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    mpirun "${root[@]}" -np $n --oversubscribe --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
      "$bench/mpi_allreduce_bench" --max-bytes "$max" >"$out/mpi.$n" 2>&1 || echo "(Open MPI run on $n ranks failed)"
    COHORT_COMMUNICATOR=mpi mpirun "${root[@]}" -np $n --oversubscribe --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include lo -x COHORT_COMMUNICATOR "$bench/cohort_allreduce_bench" --max-bytes "$max" \
      >"$out/cohort_mpi.$n" 2>&1 || echo "(cohort's MPI communicator run on $n ranks failed)"
  fi
  if [ -x "$bench/gloo_allreduce_bench" ]; then
    store=$(mktemp -d -p "$out")
    COHORT_GLOO_STORE=$store "$build/cohort-launch" --workers $n -- "$bench/gloo_allreduce_bench" --max-bytes "$max" \
      >"$out/gloo.$n" 2>&1 || echo "(Gloo run on $n ranks failed)"
  fi
done

ceiling=""
if command -v iperf3 >/dev/null; then
  port=$(( 20000 + RANDOM % 20000 ))
  iperf3 -s -1 -B 127.0.0.1 -p $port >/dev/null 2>&1 &
  sleep 0.5
  ceiling=$(iperf3 -c 127.0.0.1 -p $port -t 3 -f G 2>/dev/null | awk '/receiver/ {print $(NF-2)}')
  wait
fi

python3 - "$out" "$ceiling" <<'PY'
import os, re, sys
out, ceiling = sys.argv[1], sys.argv[2]
def table(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        m = re.search(r"^(?:\[[^]]+\] )?\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(yes|NO)\s*$", line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(4)), m.group(5) == "yes")
    return rows
for n in (2, 4):
    c, m, g, cm = (table(f"{out}/{name}.{n}") for name in ("cohort", "mpi", "gloo", "cohort_mpi"))
    print(f"\nallreduce, float32 sum, {n} ranks on loopback TCP: busbw in GB/s (correct), ratio = cohort / peer")
    print(f"{'size':>10} {'cohort ring':>14} {'cohort MPI':>14} {'Open MPI':>14} {'Gloo':>14} {'vs MPI':>8} {'vs Gloo':>8}")
    def cell(rows, size):
        return f"{rows[size][1]:8.3f} ({'ok' if rows[size][2] else 'BAD'})" if size in rows else f"{'-':>13}"
    def ratio(rows, size):
        return f"{c[size][1] / rows[size][1]:7.2f}x" if size in rows and rows[size][1] > 0 else f"{'-':>8}"
    for size in sorted(c):
        label = f"{size // 1048576} MiB" if size >= 1048576 else f"{size // 1024} KiB"
        print(f"{label:>10} {cell(c, size):>14} {cell(cm, size):>14} {cell(m, size):>14} {cell(g, size):>14} "
              f"{ratio(m, size)} {ratio(g, size)}")
if ceiling:
    print(f"\nloopback TCP ceiling (iperf3, one stream): {ceiling} GB/s")
PY
