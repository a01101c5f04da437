#!/usr/bin/env bash
# One command for the allreduce picture on this machine, 2 and 4 ranks, 4 KiB to 256 MiB, with the ratios:
#   - cohort over shared memory (its default between ranks on one host) beside Open MPI's shared-memory
#     path (btl vader), with one thread's memcpy bandwidth as the ceiling, and one core's copy of what
#     another core has just written (cohort_allreduce_bench --cores, cross_core.hpp);
#   - cohort over loopback TCP (COHORT_SHARED_MEMORY=0) beside Open MPI's TCP path (ob1/tcp forced) and
#     Gloo's ring allreduce, with the loopback TCP bandwidth (iperf3) as the ceiling;
#   - cohort over TLS 1.3 (COHORT_TLS=1, TCP only), and what encryption costs against plain TCP, with the
#     AES-GCM rate of one core (cohort_tls_bench) as its ceiling;
#   - cohort's MPI communicator under the same mpirun settings as Open MPI's own TCP run.
# Peers that are not installed are skipped (Debian: openmpi-bin libopenmpi-dev libgloo-dev iperf3).
# Before and after each run it measures a cache line's round trip between two cores: on a virtual machine it
# moves with where the hypervisor puts the cores, and every transport's bandwidth with it. A pair of runs
# compared in a ratio that met placements more than 1.8x apart is run again, twice at most; the tables print
# the round trips and mark the ratios that still compare unlike placements.
#   usage: benchmarks/allreduce_compare.sh [BUILD_DIR] [MAX_BYTES]
set -uo pipefail
case ${1:-} in -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
build=${1:-build}
max=${2:-268435456}
bench=$build/benchmarks
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -x "$bench/cohort_allreduce_bench" ] || { echo "allreduce_compare: build first (make bench)" >&2; exit 2; }

"$bench/cohort_allreduce_bench" --memcpy --max-bytes "$max" >"$out/memcpy" 2>&1
"$bench/cohort_allreduce_bench" --cores --max-bytes "$max" >"$out/cores" 2>&1
# A peer's sweep into FILE, with a cache line's round trip between two cores before and after it (the tables
# read them): on a virtual machine it moves with where the hypervisor puts the cores, and every transport's
# bandwidth with it.
placement() { "$bench/cohort_allreduce_bench" --cores --min-bytes 4096 --max-bytes 4096 2>&1 | grep 'round trip'; }
run_into() {
  local file=$1 status
  shift
  placement >"$file"
  "$@" >>"$file" 2>&1
  status=$?
  placement >>"$file"
  return $status
}
# Round trips further apart than this factor are different placements.
apart=1.8
# Whether the runs whose outputs are given met placements of the cores within $apart of each other.
alike() { cat "$@" 2>/dev/null | awk -v apart=$apart '/round trip/ {v = $7 + 0; if (!n++ || v < lo) lo = v; if (v > hi) hi = v}
                                                      END {exit !(n < 2 || hi <= apart * lo)}'; }
# The peers' runs on $n ranks, one function each, named as their output files.
cohort_shm() { run_into "$out/cohort_shm.$n" "$build/cohort-launch" --workers $n -- "$bench/cohort_allreduce_bench" --max-bytes "$max" \
  || { echo "cohort run on $n ranks failed:"; cat "$out/cohort_shm.$n"; exit 1; }; }
cohort() { run_into "$out/cohort.$n" env COHORT_SHARED_MEMORY=0 "$build/cohort-launch" --workers $n -- "$bench/cohort_allreduce_bench" \
  --max-bytes "$max" || { echo "cohort TCP run on $n ranks failed:"; cat "$out/cohort.$n"; exit 1; }; }
cohort_tls() { run_into "$out/cohort_tls.$n" env COHORT_TLS=1 COHORT_SHARED_MEMORY=0 "$build/cohort-launch" --workers $n -- \
  "$bench/cohort_allreduce_bench" --max-bytes "$max" || { echo "cohort TLS run on $n ranks failed:"; cat "$out/cohort_tls.$n"; exit 1; }; }
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
mpi_shm() { run_into "$out/mpi_shm.$n" mpirun "${root[@]}" -np $n --oversubscribe --mca pml ob1 --mca btl vader,self \
  "$bench/mpi_allreduce_bench" --max-bytes "$max" || echo "(Open MPI shared-memory run on $n ranks failed)"; }
mpi() { run_into "$out/mpi.$n" mpirun "${root[@]}" -np $n --oversubscribe --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
  "$bench/mpi_allreduce_bench" --max-bytes "$max" || echo "(Open MPI run on $n ranks failed)"; }
cohort_mpi() { run_into "$out/cohort_mpi.$n" env COHORT_COMMUNICATOR=mpi mpirun "${root[@]}" -np $n --oversubscribe --mca pml ob1 \
  --mca btl tcp,self --mca btl_tcp_if_include lo -x COHORT_COMMUNICATOR "$bench/cohort_allreduce_bench" --max-bytes "$max" \
  || echo "(cohort's MPI communicator run on $n ranks failed)"; }
gloo() { run_into "$out/gloo.$n" env COHORT_GLOO_STORE="$(mktemp -d -p "$out")" "$build/cohort-launch" --workers $n -- \
  "$bench/gloo_allreduce_bench" --max-bytes "$max" || echo "(Gloo run on $n ranks failed)"; }
# Runs FIRST and SECOND, and both again (at most twice more) while they met different placements, so that their
# ratio compares one machine with itself; with SECOND already run, `rerun` runs only FIRST again.
matched() {
  local try
  for try in 1 2 3; do
    "$1"
    [ "${3:-}" = rerun ] || "$2"
    alike "$out/$1.$n" "$out/$2.$n" && return
  done
}
have_mpi=false; [ -x "$bench/mpi_allreduce_bench" ] && command -v mpirun >/dev/null && have_mpi=true
for n in 2 4; do
  if $have_mpi; then matched cohort_shm mpi_shm; matched cohort mpi; cohort_mpi; else cohort_shm; cohort; fi
  matched cohort_tls cohort rerun
  [ -x "$bench/gloo_allreduce_bench" ] && matched gloo cohort rerun
done

# AES-128-GCM on one core, records in the cache: each record engine TLS may use (the last is the one it does).
[ -x "$bench/cohort_tls_bench" ] && "$bench/cohort_tls_bench" --benchmark_filter='Records/engine:[0-9]/cold:0' \
  --benchmark_format=csv >"$out/tls_engines" 2>/dev/null

ceiling=""
if command -v iperf3 >/dev/null; then
  port=$(( 20000 + RANDOM % 20000 ))
  iperf3 -s -1 -B 127.0.0.1 -p $port >/dev/null 2>&1 &
  sleep 0.5
  ceiling=$(iperf3 -c 127.0.0.1 -p $port -t 3 -f G 2>/dev/null | awk '/receiver/ {print $(NF-2)}')
  wait
fi

python3 - "$out" "$ceiling" "$apart" <<'PY'
import os, re, sys
out, ceiling, apart = sys.argv[1], sys.argv[2], float(sys.argv[3])
def table(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        m = re.search(r"^(?:\[[^]]+\] )?\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(yes|NO)\s*$", line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(4)), m.group(5) == "yes")
    return rows
def label(size):
    return f"{size // 1048576} MiB" if size >= 1048576 else f"{size // 1024} KiB"
def cell(rows, size):
    return f"{rows[size][1]:7.3f} ({'ok' if rows[size][2] else 'BAD'})" if size in rows else f"{'-':>12}"
def latency(rows, size):
    return f"{rows[size][0]:9.1f}" if size in rows else f"{'-':>9}"
def round_trips(path):  # ns, before and after the run
    return [float(ns) for ns in re.findall(r"round trip (\d+) ns", open(path).read())] if os.path.exists(path) else []
def unlike(*runs):  # the runs met placements of the cores more than `apart` apart
    trips = [ns for run in runs for ns in run.trips]
    return len(trips) > 1 and max(trips) > apart * min(trips)
class Run(dict):
    def __init__(self, path):
        super().__init__(table(path))
        self.trips = round_trips(path)
def ratio(mine, peer, size):
    if size not in mine or size not in peer or peer[size][1] <= 0:
        return f"{'-':>8}"
    return f"{mine[size][1] / peer[size][1]:6.2f}x{'*' if unlike(mine, peer) else ' '}"
copy, cores = table(f"{out}/memcpy"), Run(f"{out}/cores")
cipher = ""
if os.path.exists(f"{out}/tls_engines"):
    import csv
    lines = [line for line in open(f"{out}/tls_engines") if line.startswith(("name,", '"BM_'))]
    engines = [row for row in csv.DictReader(lines) if not row["error_occurred"]]
    seal = [row for row in engines if "Seal" in row["name"]]
    opened = [row for row in engines if "Open" in row["name"]]
    if seal and opened:
        def rate(row):
            return f"{float(row['bytes_per_second']) / 1e9:.1f}"
        cipher = (f"AES-128-GCM on one core {rate(seal[-1])} seal / {rate(opened[-1])} open GB/s ({seal[-1]['label']}; "
                  f"OpenSSL {rate(seal[0])} / {rate(opened[0])})")
for n in (2, 4):
    names = {"cohort_shm": "cohort shm", "mpi_shm": "Open MPI shm", "cohort": "cohort TCP", "mpi": "Open MPI TCP",
             "gloo": "Gloo", "cohort_mpi": "cohort MPI", "cohort_tls": "cohort TLS"}
    runs = {name: Run(f"{out}/{name}.{n}") for name in names}
    shm, mpi_shm, tcp, mpi, gloo, cohort_mpi, tls = runs.values()
    print(f"\nallreduce, float32 sum, {n} ranks on one host: busbw in GB/s (correct), ratio = cohort / peer")
    if ceiling:
        print(f"ceilings: one thread's memcpy, one core's copy of what another just wrote (cross-core; round trip "
              f"{cores.trips[0] if cores.trips else 0:.0f} ns then), loopback TCP {ceiling} GB/s (iperf3, one stream)")
    print("a cache line's round trip between two cores before/after each run, ns: " +
          ", ".join(f"{label} {'/'.join(f'{ns:.0f}' for ns in runs[name].trips)}" for name, label in names.items() if runs[name].trips))
    if any(unlike(a, b) for a, b in ((shm, mpi_shm), (tcp, mpi), (tcp, gloo), (tls, tcp))):
        print(f"  * the two runs met placements of the cores more than {apart}x apart: that ratio compares unlike machines")
    if cipher:
        print(f"TLS: {cipher}")
    print(f"{'size':>8} | {'cohort shm':>12} {'Open MPI shm':>12} {'memcpy':>12} {'cross-core':>12} {'vs MPI':>8} | "
          f"{'cohort TCP':>12} {'Open MPI TCP':>12} {'Gloo':>12} {'cohort MPI':>12} {'vs MPI':>8} {'vs Gloo':>8} | "
          f"{'cohort TLS':>12} {'vs TCP':>8}")
    for size in sorted(set(shm) | set(tcp)):
        print(f"{label(size):>8} | {cell(shm, size)} {cell(mpi_shm, size)} {cell(copy, size)} {cell(cores, size)} {ratio(shm, mpi_shm, size)} | "
              f"{cell(tcp, size)} {cell(mpi, size)} {cell(gloo, size)} {cell(cohort_mpi, size)} {ratio(tcp, mpi, size)} "
              f"{ratio(tcp, gloo, size)} | {cell(tls, size)} {ratio(tls, tcp, size)}")
    print(f"time per allreduce in us: {'size':>8} {'cohort shm':>10} {'MPI shm':>9} {'cohort TCP':>10} {'MPI TCP':>9}")
    for size in sorted(shm)[:4]:
        print(f"{'':>26}{label(size):>8} {latency(shm, size):>10} {latency(mpi_shm, size)} {latency(tcp, size):>10} {latency(mpi, size)}")
PY
