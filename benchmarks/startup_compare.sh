#!/usr/bin/env bash
# How a job's start-up grows with its ranks on one host: for each rank count, the time from main() to the
# end of the first allreduce (the slowest process, and the median), the most file descriptors a process
# then holds, the host's shared memory (/proc/meminfo Shmem, about 10 MiB before any job), and the whole
# job's wall time under cohort-launch (or mpirun): cohort over shared memory and over TCP alone, beside
# Open MPI's shared-memory and TCP paths when it is installed (Debian: openmpi-bin libopenmpi-dev).
#   usage: benchmarks/startup_compare.sh [BUILD_DIR] [RANK COUNTS...]     (default: 4 8 16 32 64 128)
set -uo pipefail
case ${1:-} in -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
build=${1:-build}
shift || true
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(4 8 16 32 64 128)
bench=$build/benchmarks
[ -x "$bench/cohort_allreduce_bench" ] || { echo "startup_compare: build first (make bench-allreduce)" >&2; exit 2; }
root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)

# Runs a job, then prints its wall time and its chief's startup line.
measure() {
  local label=$1; shift
  local began ended line
  began=$(date +%s.%N)
  line=$(timeout 600 "$@" 2>&1 | grep -o 'startup: .*')
  ended=$(date +%s.%N)
  printf '%-16s %s, job %s s\n' "$label" "${line:-startup: FAILED}" "$(awk -v a="$began" -v b="$ended" 'BEGIN { printf "%.2f", b - a }')"
}

printf 'cores: %s, memory: %s MiB, descriptors allowed per process: %s\n' "$(nproc)" \
  "$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)" "$(ulimit -n)"
for n in "${counts[@]}"; do
  measure "cohort shm" "$build/cohort-launch" --workers "$n" -- "$bench/cohort_allreduce_bench" --startup
  COHORT_SHARED_MEMORY=0 measure "cohort TCP" "$build/cohort-launch" --workers "$n" -- "$bench/cohort_allreduce_bench" --startup
  if [ -x "$bench/mpi_allreduce_bench" ] && command -v mpirun >/dev/null; then
    measure "Open MPI shm" mpirun "${root[@]}" -np "$n" --oversubscribe --mca pml ob1 --mca btl vader,self \
      "$bench/mpi_allreduce_bench" --startup
    measure "Open MPI TCP" mpirun "${root[@]}" -np "$n" --oversubscribe --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include lo "$bench/mpi_allreduce_bench" --startup
  fi
done
