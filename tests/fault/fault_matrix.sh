#!/usr/bin/env bash
# The fault matrix: SIGKILL and SIGSTOP of the chief, a worker and a parameter server, at start-up, in
# training and around a checkpoint, for parameter servers (2 workers + 2 ps) and ring allreduce (3 workers),
# under cohort-launch and started by hand; then --restarts after a kill, for both strategies.
# Each case asserts that
#   - under the launcher: its verdict names the process that was hit (killed, or stopped), and it ends
#     within the deadline (peer timeout + set-up deadline + margin), killing a stopped process itself;
#   - by hand: every other process exits non-zero by itself within the deadline, naming the one hit;
#   - with --restarts 1: the job finishes, resuming at the last checkpoint written before the kill, and its
#     model file is the same bytes as an uninterrupted run's.
# Then a stuck process: its main thread alone stopped (FREEZE_THREAD, by ptrace), so that its transport
# goes on with heartbeats; the others name it stuck within the progress deadline (COHORT_TIMEOUT), under
# the launcher, whose verdict names it and which kills it, and by hand. Last a process stuck at its end
# (held as it exits, its work done): the launcher names it and stops it once --grace has passed.
#   usage: fault_matrix.sh [--short] LAUNCHER FASHION_MNIST_EXAMPLE FREEZE_THREAD
# --short (CI) runs a cross-section of 16 cases; without it, all 98 (about 16 minutes on 2 cores).
set -uo pipefail
short=0
[ "${1:-}" = "--short" ] && { short=1; shift; }
launcher=$1 example=$2 freeze=$3
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; pkill -9 -P $$ 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/../launch/common.sh"

# Short deadlines, so that a hang shows within seconds: a stopped process is lost after 2 s of silence.
export COHORT_PEER_TIMEOUT=2s COHORT_HEARTBEAT_INTERVAL=200ms COHORT_CONNECT_TIMEOUT=8s COHORT_TIMEOUT=10s
# Separate runs are compared byte for byte, and without COHORT_GEMM their matrix products take one path.
unset COHORT_GEMM
deadline=25  # seconds from the signal to the end of every process
stuck_deadline=30  # from freezing a process's main thread: the progress deadline (COHORT_TIMEOUT) + margin
args=(--train-samples 12000 --batch-size 32 --epochs 1 --threads 1)
cases=0

wait_for() {  # PATTERN FILE: within 60 s
  for _ in $(seq 1 600); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# Waits until the job reaches PHASE (start, train, checkpoint); the log is $1, checkpoints go to $2.
reach() {
  local phase=$1 log=$2 checkpoints=$3
  case $phase in
    start) wait_for 'started\|listening\|device:' "$log" ;;
    train) wait_for 'Epoch 1/1' "$log" && sleep 1 ;;
    checkpoint) wait_for 'checkpoint of step [0-9]* saved' "$log" ;;
  esac
}

free_port() {  # a port nothing listens on now, from a range the kernel does not hand out itself
  local port
  while :; do
    port=$((20000 + RANDOM % 12000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}

# Hits process PID with SIGNAL: KILL, STOP, or FREEZE (its main thread alone stopped, by $freeze, which
# holds it until the process ends).
hit() {
  local signal=$1 pid=$2
  if [ "$signal" != FREEZE ]; then
    kill -"$signal" "$pid" 2>/dev/null
    return
  fi
  kill -0 "$pid" 2>/dev/null || return 1
  "$freeze" "$pid" >"$work/freeze" 2>&1 &
  wait_for "frozen $pid" "$work/freeze" || { cat "$work/freeze" >&2; return 1; }
}

deadline_of() {  # SIGNAL
  if [ "$1" != FREEZE ]; then echo $deadline; else echo $stuck_deadline; fi
}

# STRATEGY: ps (synchronous), ps-async, ps-backup (synchronous, one backup worker) or allreduce.
strategy_args() {  # STRATEGY: the example's options that choose it
  case $1 in
    ps-async) echo "--consistency async" ;;
    ps-backup) echo "--consistency sync:backup=1" ;;
  esac
}

processes_of() {  # STRATEGY: the process names of its job
  if [ "${1%%-*}" = ps ]; then echo "chief 0;worker 0;ps 0;ps 1"; else echo "chief 0;worker 0;worker 1"; fi
}

launcher_flags() {  # STRATEGY
  if [ "${1%%-*}" = ps ]; then echo "--workers 2 --ps 2"; else echo "--workers 3"; fi
}

# One case under the launcher.
launched() {
  local strategy=$1 signal=$2 victim=$3 phase=$4
  local log=$work/log checkpoints=$work/ckpt-$cases
  cases=$((cases + 1))
  echo "case $cases: launcher, $strategy, SIG$signal $victim at $phase"
  : >"$log"  # emptied before the background launch, whose own truncation may come after the first wait_for
  # shellcheck disable=SC2046
  "$launcher" $(launcher_flags "$strategy") --grace 60 -- "$example" "${args[@]}" $(strategy_args "$strategy") \
    --checkpoint-dir "$checkpoints" --checkpoint-every 10 >"$log" 2>&1 &
  local launcher_pid=$!
  wait_for "$victim (pid [0-9]*)" "$log" || fail "no pid for $victim"
  reach "$phase" "$log" "$checkpoints" || fail "the job never reached $phase"
  local pid
  pid=$(grep -o "$victim (pid [0-9]*)" "$log" | head -1 | grep -o '[0-9]*)' | tr -d ')')
  local hit_at=$SECONDS
  hit "$signal" "$pid" || fail "$victim had already ended before SIG$signal"
  wait "$launcher_pid"
  local status=$? took=$((SECONDS - hit_at))
  [ $status -ne 0 ] || fail "the launcher succeeded after SIG$signal of $victim"
  [ $took -le "$(deadline_of "$signal")" ] || fail "the job took $took s to end after SIG$signal of $victim"
  case $signal in
    KILL) grep -q "failed: $victim (pid $pid) was killed by signal 9" "$log" || fail "the verdict does not name the killed $victim" ;;
    STOP) grep -q "failed: $victim (pid $pid) is stopped" "$log" || fail "the verdict does not name the stopped $victim" ;;
    FREEZE) grep -q "failed: $victim (pid $pid) is stuck" "$log" || fail "the verdict does not name the stuck $victim"
            grep -q "killing $victim (pid $pid)" "$log" || fail "the launcher did not kill the stuck $victim" ;;
  esac
  echo "  the job ended $took s after SIG$signal"
  kill -0 "$pid" 2>/dev/null && fail "$victim outlived the launcher"
  return 0
}

# One case started by hand: TF_CONFIG for each process, as a cluster manager would.
by_hand() {
  local strategy=$1 signal=$2 victim=$3 phase=$4
  local log=$work/log
  cases=$((cases + 1))
  echo "case $cases: by hand, $strategy, SIG$signal $victim at $phase"
  IFS=';' read -r -a names <<<"$(processes_of "$strategy")"
  local ports=() name
  for _ in "${names[@]}"; do ports+=("$(free_port)"); done
  local chief="\"127.0.0.1:${ports[0]}\"" workers="" ps=""
  for i in "${!names[@]}"; do
    case ${names[$i]} in
      worker*) workers+="${workers:+, }\"127.0.0.1:${ports[$i]}\"" ;;
      ps*) ps+="${ps:+, }\"127.0.0.1:${ports[$i]}\"" ;;
    esac
  done
  local cluster="\"chief\": [$chief], \"worker\": [$workers]${ps:+, \"ps\": [$ps]}"
  local secret pids=() victim_pid=""
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  : >"$log"
  for i in "${!names[@]}"; do
    name=${names[$i]}
    local role=${name% *} index=${name#* }
    TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"$role\", \"index\": $index}}" COHORT_SECRET=$secret \
      OMP_NUM_THREADS=1 "$example" "${args[@]}" $(strategy_args "$strategy") --checkpoint-dir "$work/ckpt-$cases" \
      --checkpoint-every 10 >"$work/out-$i" 2>&1 &
    pids+=($!)
    [ "$name" = "$victim" ] && victim_pid=$!
  done
  reach "$phase" "$work/out-0" "" || fail "the job never reached $phase"
  local hit_at=$SECONDS limit
  limit=$(deadline_of "$signal")
  hit "$signal" "$victim_pid" || fail "$victim had already ended before SIG$signal"
  for i in "${!names[@]}"; do
    [ "${names[$i]}" = "$victim" ] && continue
    local waited=0
    while kill -0 "${pids[$i]}" 2>/dev/null && [ $waited -lt $((limit * 10)) ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -0 "${pids[$i]}" 2>/dev/null && { cat "$work/out-$i" >"$log"; fail "${names[$i]} still runs $limit s after SIG$signal of $victim"; }
    wait "${pids[$i]}"
    local status=$?
    cp "$work/out-$i" "$log"
    if [ $status -eq 0 ]; then
      # With backup workers the steps wait for no one worker: the chief may finish the run while a worker is
      # stuck. A worker's run ends with the chief's, so no worker may succeed while the chief is stuck.
      [ "$strategy" = ps-backup ] && [ "${names[$i]}" = "chief 0" ] || fail "${names[$i]} succeeded after SIG$signal of $victim"
      continue
    fi
    if [ "$signal" = FREEZE ]; then
      grep -q "$victim (.*) is stuck" "$work/out-$i" || fail "${names[$i]} did not name $victim stuck"
    else
      grep -q "lost $victim\|could not connect within .* $victim\|$victim .*left the group" "$work/out-$i" ||
        fail "${names[$i]} did not name $victim"
    fi
  done
  kill -9 "$victim_pid" 2>/dev/null
  wait "$victim_pid" 2>/dev/null
  echo "  every process ended within $((SECONDS - hit_at)) s"
  return 0
}

# A process whose work is done but which never ends (its main thread held as it asks to exit): the others
# succeed, and the launcher gives it --grace seconds, then names it and stops it, and the job fails.
stuck_at_end() {
  local strategy=$1 victim=$2 grace=5
  local log=$work/log
  cases=$((cases + 1))
  echo "case $cases: launcher, $strategy, $victim stuck at its end"
  : >"$log"
  # shellcheck disable=SC2046
  "$launcher" $(launcher_flags "$strategy") --grace $grace -- "$example" "${args[@]}" $(strategy_args "$strategy") \
    >"$log" 2>&1 &
  local launcher_pid=$!
  wait_for "$victim (pid [0-9]*)" "$log" || fail "no pid for $victim"
  reach train "$log" "" || fail "the job never reached training"
  local pid
  pid=$(grep -o "$victim (pid [0-9]*)" "$log" | head -1 | grep -o '[0-9]*)' | tr -d ')')
  "$freeze" --at-exit "$pid" >"$work/freeze" 2>&1 &
  wait_for "tracing $pid" "$work/freeze" || { cat "$work/freeze" >&2; fail "cannot trace $victim"; }
  wait_for "frozen $pid" "$work/freeze" || { cat "$work/freeze" "$log" >&2; fail "$victim never reached its exit"; }
  local held_at=$SECONDS
  # A launcher that waits on without end is ended here, and the case fails by its time.
  (sleep $((grace + 40)); kill -9 "$launcher_pid" "$pid" 2>/dev/null) &
  local watchdog=$!
  wait "$launcher_pid"
  local status=$? took=$((SECONDS - held_at))
  kill "$watchdog" 2>/dev/null
  [ $status -ne 0 ] || fail "the launcher succeeded while $victim never ended"
  # The grace period, then 5 s from the launcher's SIGTERM to its SIGKILL (the held thread takes no signal), and a margin.
  [ $took -le $((grace + 15)) ] || fail "the job took $took s to end after $victim was held at its exit"
  grep -q "failed: $victim (pid $pid) did not exit within $grace s after the others finished (stuck?) and was stopped" "$log" ||
    fail "the verdict does not name $victim, which never ended"
  kill -0 "$pid" 2>/dev/null && fail "$victim outlived the launcher"
  echo "  the launcher named and stopped it $took s after it was held"
}

# --restarts 1 after a kill in training: the job finishes, resumed at the last checkpoint written before,
# with the model an uninterrupted run of the same job writes, byte for byte.
restarted() {
  local strategy=$1 victim=$2
  local log=$work/log checkpoints=$work/ckpt-restart-$strategy
  cases=$((cases + 1))
  echo "case $cases: launcher --restarts 1, $strategy, SIGKILL $victim in training"
  # shellcheck disable=SC2046
  "$launcher" $(launcher_flags "$strategy") -- "$example" "${args[@]}" --save-model "$work/uninterrupted.model" \
    >"$log" 2>&1 || { cat "$log" >&2; fail "the uninterrupted run failed"; }
  : >"$log"  # as in launched(): the previous case's lines must not be read as this one's
  # shellcheck disable=SC2046
  "$launcher" $(launcher_flags "$strategy") --grace 10 --restarts 1 -- "$example" "${args[@]}" \
    --save-model "$work/restarted.model" --checkpoint-dir "$checkpoints" --checkpoint-every 10 >"$log" 2>&1 &
  local launcher_pid=$!
  wait_for 'checkpoint of step [0-9]* saved' "$log" || fail "no checkpoint was written"
  sleep 0.5
  local pid
  pid=$(grep -o "$victim (pid [0-9]*)" "$log" | head -1 | grep -o '[0-9]*)' | tr -d ')')
  kill -9 "$pid"
  local saved
  saved=$(grep -o 'checkpoint of step [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  wait "$launcher_pid" || fail "the restarted job failed"
  grep -q 'restarting the job from its latest checkpoint (restart 1 of 1)' "$log" || fail "no restart announced"
  local resumed
  resumed=$(grep -o '^\[chief 0\] .*resumed from .*step [0-9]*' "$log" | head -1 | grep -o '[0-9]*$')
  [ -n "$resumed" ] || fail "the restarted chief did not resume from a checkpoint"
  # Checkpoints written between reading the log and the kill count too: at most one more.
  [ "$resumed" -ge "$saved" ] && [ "$resumed" -le $((saved + 10)) ] ||
    fail "resumed at step $resumed, the last checkpoint before the kill was step $saved"
  grep -q '^\[chief 0\] test accuracy: 0\.[4-9]' "$log" || fail "the restarted job did not finish training"
  cmp -s "$work/uninterrupted.model" "$work/restarted.model" ||
    fail "the restarted job's model differs from the uninterrupted run's ($(sha256sum "$work/uninterrupted.model" "$work/restarted.model" | cut -c1-16 | tr '\n' ' '))"
  echo "  resumed at step $resumed (last checkpoint seen before the kill: step $saved); the model equals the uninterrupted run's"
}

if [ $short -eq 1 ]; then
  launched ps STOP "ps 0" train
  launched allreduce KILL "chief 0" start
  launched ps KILL "worker 0" checkpoint
  launched allreduce STOP "worker 1" checkpoint
  by_hand allreduce STOP "worker 1" train
  by_hand ps KILL "ps 1" start
  restarted ps "worker 0"
  restarted allreduce "worker 1"
  launched ps FREEZE "worker 0" train
  launched ps-async FREEZE "chief 0" train
  launched allreduce FREEZE "worker 1" train
  by_hand ps FREEZE "worker 0" train
  by_hand ps-backup FREEZE "chief 0" train
  by_hand allreduce FREEZE "worker 1" train
  stuck_at_end ps "worker 0"
  stuck_at_end allreduce "chief 0"
else
  for strategy in ps allreduce; do
    IFS=';' read -r -a victims <<<"$(processes_of "$strategy")"
    for signal in KILL STOP; do
      for victim in "${victims[@]}"; do
        [ "$victim" = "ps 1" ] && continue
        for phase in start train checkpoint; do
          launched "$strategy" "$signal" "$victim" "$phase"
          by_hand "$strategy" "$signal" "$victim" "$phase"
        done
      done
    done
    restarted "$strategy" "worker 0"
  done
  for strategy in ps ps-async ps-backup; do
    for victim in "chief 0" "worker 0"; do
      launched "$strategy" FREEZE "$victim" train
      by_hand "$strategy" FREEZE "$victim" train
    done
  done
  for victim in "chief 0" "worker 1"; do
    launched allreduce FREEZE "$victim" train
    by_hand allreduce FREEZE "$victim" train
    stuck_at_end allreduce "$victim"
  done
  for strategy in ps ps-async ps-backup; do
    for victim in "chief 0" "worker 0"; do stuck_at_end "$strategy" "$victim"; done
  done
fi
echo "fault matrix: $cases cases passed"
