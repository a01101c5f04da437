#!/usr/bin/env bash
# Parameter-server jobs under cohort-launch, as separate processes on real Fashion-MNIST:
# 1. SIGKILL of a worker, then of a parameter server, in a running 2 + 2 job: every other process exits
#    non-zero within 30 s, naming the lost one;
# 2. --restarts 1: a worker killed after a checkpoint; the job starts again, resumes from the checkpoint
#    and finishes;
# 3. the job over TLS (COHORT_TLS=1) trains and writes one timeline, a track per process; COHORT_GEMM=fastest
#    measures its matrix products' path;
# 4-6. options that do not fit the job (COHORT_COMMUNICATOR=mpi without mpirun, --consistency without servers,
#    --shard-optimizer or --gradient-codec with servers) are refused or named.
#   usage: ps_launch_test.sh LAUNCHER FASHION_MNIST_EXAMPLE
set -uo pipefail
launcher=$1 example=$2
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/common.sh"
args=(--train-samples 20000 --batch-size 64 --epochs 1 --threads 1)

wait_for() {  # pattern in the log, within 60 s
  for _ in $(seq 1 600); do grep -q "$1" "$work/log" && return 0; sleep 0.1; done
  return 1
}

kill_one() {
  local victim_name=$1
  "$launcher" --workers 2 --ps 2 --grace 40 -- "$example" "${args[@]}" >"$work/log" 2>&1 &
  local launcher_pid=$!
  wait_for '^\[chief 0\] *[0-9]*/157' || fail "the job did not start training"
  kill_and_expect "$launcher_pid" "$victim_name" "chief 0" "worker 0" "ps 0" "ps 1"
}
kill_one "worker 0"
kill_one "ps 1"

# 2. A restart from the latest checkpoint.
checkpoints="$work/checkpoints"
"$launcher" --workers 2 --ps 2 --grace 5 --restarts 1 -- "$example" "${args[@]}" --checkpoint-dir "$checkpoints" \
  --checkpoint-every 20 >"$work/log" 2>&1 &
launcher_pid=$!
for _ in $(seq 1 600); do [ -f "$checkpoints/ps.manifest" ] && break; sleep 0.1; done
[ -f "$checkpoints/ps.manifest" ] || fail "no checkpoint manifest was written"
kill -9 "$(pid_of "worker 0")"
wait "$launcher_pid"
status=$?
[ $status -eq 0 ] || fail "the restarted job failed (status $status)"
grep -q 'restarting the job from its latest checkpoint (restart 1 of 1)' "$work/log" || fail "no restart announced"
grep -q '^\[chief 0\] .*resumed from .*step [1-9]' "$work/log" || fail "the restarted chief did not resume from the checkpoint"
grep -q '^\[chief 0\] test accuracy: 0\.[5-9]' "$work/log" || fail "the restarted job did not finish training"
# 3. The same job over TLS trains, and writes its timeline; its matrix products take the path the chief measured.
COHORT_TLS=1 COHORT_GEMM=fastest timeout 240 "$launcher" --workers 2 --ps 2 -- "$example" "${args[@]}" --max-steps 40 \
  --timeline "$work/job.json" >"$work/log" 2>&1 || fail "the 2 + 2 job over TLS failed"
grep -q "timeline of the job written to $work/job.json" "$work/log" || fail "the launcher did not merge the timelines"
for process in "chief 0" "worker 0" "ps 0" "ps 1"; do
  grep -qF "\"args\":{\"name\":\"$process\"},\"name\":\"process_name\"" "$work/job.json" ||
    fail "the job's timeline has no track for $process"
done
for event in '"name":"values from ps 1"' '"name":"apply update"' '"cat":"backward"' '"name":"wait for batch"'; do
  grep -qF "$event" "$work/job.json" || fail "the job's timeline has no $event"
done
grep -q 'connections: TLS 1.3' "$work/log" || fail "the job did not run over TLS"
grep -q '^\[chief 0\] .*matrix products through [a-z]*, measured at [0-9.]*x Eigen' "$work/log" ||
  fail "COHORT_GEMM=fastest did not log the path it measured"
grep -q '^\[chief 0\] test accuracy: 0\.[3-9]' "$work/log" || fail "the job over TLS did not learn"
# The staleness table names the workers as the launcher and the errors do.
grep -q '^\[chief 0\] chief 0  *[0-9]' "$work/log" && grep -q '^\[chief 0\] worker 0  *[0-9]' "$work/log" ||
  fail "the staleness table does not name the workers chief 0 and worker 0"
# 4. COHORT_COMMUNICATOR=mpi in a job mpirun did not start is refused, not run as separate one-process jobs.
output=$(COHORT_COMMUNICATOR=mpi timeout 120 "$launcher" --workers 2 -- "$example" "${args[@]}" --max-steps 2 2>&1)
[ $? -ne 0 ] && grep -qE "COHORT_COMMUNICATOR=mpi, but MPI sees 1 process\(es\) where the cluster \(TF_CONFIG\) has 2|has no MPI communicator" <<<"$output" ||
  fail "COHORT_COMMUNICATOR=mpi without mpirun was not refused: $(tail -3 <<<"$output")"
# 5. A parameter-server option in a job without servers is said to have no effect.
output=$(timeout 120 "$launcher" --workers 2 -- "$example" "${args[@]}" --max-steps 2 --consistency async 2>&1) ||
  fail "a ring job with --consistency async failed: $(tail -3 <<<"$output")"
grep -q '^\[chief 0\] .*the consistency async is for parameter servers, and this job has none' <<<"$output" ||
  fail "--consistency without parameter servers was taken without a word"
# 6. --shard-optimizer with parameter servers is refused by name, before training.
output=$(timeout 120 "$launcher" --workers 1 --ps 1 -- "$example" "${args[@]}" --max-steps 2 --shard-optimizer zero1 2>&1) &&
  fail "a parameter-server job took --shard-optimizer"
grep -q "zero1 shards the optimizer state over the workers of ring allreduce; with parameter servers" <<<"$output" ||
  fail "--shard-optimizer with parameter servers was not refused by name: $(tail -3 <<<"$output")"
output=$(timeout 120 "$launcher" --workers 1 --ps 1 -- "$example" "${args[@]}" --max-steps 2 --gradient-codec powersgd 2>&1) &&
  fail "a parameter-server job took --gradient-codec"
grep -q "the gradient codec powersgd:4 compresses the gradients of ring allreduce" <<<"$output" ||
  fail "--gradient-codec with parameter servers was not refused by name: $(tail -3 <<<"$output")"
echo "ps launch test passed"
