#!/usr/bin/env bash
# cohort-launch end to end: a failing process is reported and the rest stopped, the cause named when others
# report it lost, failed or stuck; SIGKILL of one process of
# a running 4-process allreduce makes the other three exit non-zero within 30 s, each naming the lost
# peer; SIGSTOP of one is blamed on it within seconds; a sweep over TLS is correct; Ctrl-C (SIGINT) stops
# everything; --gpus spreads the workers over GPUs; output lines come out whole and prefixed on their stream;
# the allreduce benchmark measures its cross-core ceiling.
#   usage: launch_test.sh LAUNCHER ALLREDUCE_BENCH
set -uo pipefail
launcher=$1 bench=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/common.sh"

# 1. One process fails: the launcher names it, stops the others after the grace period, exits non-zero.
start=$(date +%s)
timeout 60 "$launcher" --workers 3 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in *"\"worker\", \"index\": 1"*) echo "failing on purpose"; exit 3;; *) sleep 30;; esac' >"$work/log" 2>&1
status=$?
[ $status -ne 0 ] && [ $status -ne 124 ] || fail "launcher exit status $status after a failing process"
grep -q '^\[worker 1\] failing on purpose' "$work/log" || fail "output is not prefixed with role and index"
grep -q 'cohort-launch: failed: worker 1 (pid [0-9]*) exited with status 3; stopped 2' "$work/log" || fail "no one-line summary naming worker 1"
[ $(( $(date +%s) - start )) -lt 20 ] || fail "stopping the others took too long"

# 1b. A process that ends after the others reported it lost is the cause, not the first one to exit.
timeout 60 "$launcher" --workers 2 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in *"\"chief\", \"index\": 0"*) echo "error: lost worker 0 (127.0.0.1:1): silent"; exit 1;;
   *) sleep 0.2; exit 1;; esac' >"$work/log" 2>&1
grep -q 'failed: worker 0 (pid [0-9]*) exited with status 1, the others having lost it before (reported lost by chief 0)' "$work/log" ||
  fail "the verdict does not blame the worker the chief lost"

# 1b''. A process that others report failed, naming it with its address, is the cause though it exits last.
timeout 60 "$launcher" --workers 3 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in
     *"\"chief\", \"index\": 0"*) sleep 0.4; echo "error: cannot write ck/latest.ckpt: No space left on device"; exit 1;;
     *) echo "error: chief 0 (127.0.0.1:1) failed: cannot write ck/latest.ckpt: No space left on device"; exit 1;; esac' \
  >"$work/log" 2>&1
grep -q 'failed: chief 0 (pid [0-9]*) exited with status 1 (reported failed by ' "$work/log" ||
  fail "the verdict does not blame the chief the others report failed"

# 1b'. Losses chain around a ring (worker 1 saw worker 0 leave, which had seen the chief leave with a full
# disk): the cause is the chief, the one lost that lost nobody, though it exits last.
timeout 60 "$launcher" --workers 3 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in
     *"\"chief\", \"index\": 0"*) sleep 0.4; echo "error: cannot write ck/latest.ckpt: No space left on device"; exit 1;;
     *"\"worker\", \"index\": 0"*) sleep 0.2; echo "error: chief 0 (127.0.0.1:1) left the group"; exit 1;;
     *) echo "error: worker 0 (127.0.0.1:2) left the group"; exit 1;; esac' >"$work/log" 2>&1
grep -q 'failed: chief 0 (pid [0-9]*) exited with status 1, the others having lost it before (reported lost by worker 0)' "$work/log" ||
  fail "the verdict does not blame the chief that left first"

# 1c. A process the others report failed with its own reason (a server's full disk) is the cause, even when
# one of those others exits first.
timeout 60 "$launcher" --workers 2 --ps 1 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in *"\"ps\", \"index\": 0"*) sleep 0.3; echo "error: No space left on device"; exit 1;;
   *) echo "error: ps 0 failed: cannot write ps-step-10: No space left on device"; exit 1;; esac' >"$work/log" 2>&1
grep -q 'failed: ps 0 (pid [0-9]*) exited with status 1 (reported failed by ' "$work/log" ||
  fail "the verdict does not blame the server the workers report failed"

# 1c'. Failures chain (ps 1 reports "chief 0 failed: ps 0 failed: ..."): the cause is the end of the chain, the
# server, though the chief exits first and the server only a second later.
timeout 60 "$launcher" --workers 1 --ps 2 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in
     *"\"ps\", \"index\": 0"*) sleep 1.5; echo "error: cannot write ps-step-10: No space left on device"; exit 1;;
     *"\"ps\", \"index\": 1"*) sleep 0.2; echo "error: chief 0 failed: ps 0 failed: cannot write ps-step-10: No space left on device"; exit 1;;
     *) echo "error: step 10 was refused"; exit 1;; esac' >"$work/log" 2>&1
grep -q 'failed: ps 0 (pid [0-9]*) exited with status 1 (reported failed by ps 1)' "$work/log" ||
  fail "the verdict does not follow a chain of reported failures to its end: $(grep 'cohort-launch: failed' "$work/log")"

# 1c''. Another description of the cluster or its secret in the launcher's environment is not passed on
# (each process would refuse TF_CONFIG beside RANK, or COHORT_SECRET beside a secret file), and it says so.
RANK=3 COHORT_SECRET_FILE=/nonexistent timeout 60 "$launcher" --workers 2 --grace 1 -- sh -c \
  'test -z "${RANK-}" && test -z "${COHORT_SECRET_FILE-}" && test -n "$TF_CONFIG" && test -n "$COHORT_SECRET"' \
  >"$work/log" 2>&1 || fail "RANK or COHORT_SECRET_FILE reached the processes: $(tail -3 "$work/log")"
grep -q 'cohort-launch: RANK, COHORT_SECRET_FILE from this environment are not passed on' "$work/log" ||
  fail "the launcher did not say which settings it replaced: $(cat "$work/log")"

# 1c-3. A misspelt setting or an all-interfaces --host is refused before any process starts.
output=$(COHORT_GEMM=foo timeout 30 "$launcher" --workers 2 -- sh -c 'echo started' 2>&1)
[ $? -eq 2 ] && ! grep -q started <<<"$output" && grep -qF "COHORT_GEMM='foo': use eigen, openblas, fastest" <<<"$output" ||
  fail "COHORT_GEMM=foo was not refused before the processes started: $output"
output=$(timeout 30 "$launcher" --workers 2 --host 0.0.0.0 -- sh -c 'echo started' 2>&1)
[ $? -eq 2 ] && grep -qF -- "--host 0.0.0.0: every process would listen on every interface" <<<"$output" ||
  fail "--host 0.0.0.0 was not refused: $output"

# 1d. A process reported stuck (alive, making no progress) is the cause and is killed once the others end.
timeout 60 "$launcher" --workers 2 --grace 30 -- sh -c \
  'case "$TF_CONFIG" in *"\"chief\", \"index\": 0"*) echo "error: worker 0 (127.0.0.1:1) is stuck: connected, but ..."; exit 1;;
   *) sleep 30;; esac' >"$work/log" 2>&1
grep -q 'failed: worker 0 (pid [0-9]*) is stuck: alive and connected, but making no progress (reported by chief 0)' "$work/log" ||
  fail "the verdict does not blame the worker reported stuck"
grep -q 'killing worker 0 (pid [0-9]*): every other process has ended' "$work/log" || fail "the stuck worker was not killed"

# 1e. A parameter server that does not end after the workers succeeded is named when it is stopped.
timeout 60 "$launcher" --workers 1 --ps 1 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in *"\"ps\", \"index\": 0"*) sleep 30;; *) exit 0;; esac' >"$work/log" 2>&1
grep -q 'failed: ps 0 (pid [0-9]*) did not exit within 1 s after the others finished (stuck?) and was stopped' "$work/log" ||
  fail "the verdict does not name the server that outlived the workers"

# 1f. A worker that never ends after the chief succeeded is the stuck one; the servers still waiting for it are
# stopped with it, not blamed.
timeout 60 "$launcher" --workers 2 --ps 1 --grace 1 -- sh -c \
  'case "$TF_CONFIG" in *"\"chief\", \"index\": 0"*) exit 0;; *) sleep 30;; esac' >"$work/log" 2>&1
grep -q 'failed: worker 0 (pid [0-9]*) did not exit within 1 s after the others finished (stuck?) and was stopped; ps 0 (pid [0-9]*), still waiting for it, was stopped too' "$work/log" ||
  fail "the verdict does not name the worker the server waited for: $(tail -2 "$work/log")"

# 2. SIGKILL one process of a running allreduce job, a worker and then the chief.
kill_one() {
  local victim_name=$1
  "$launcher" --workers 4 --grace 40 -- "$bench" --min-bytes 1048576 --max-bytes 4194304 --forever >"$work/log" 2>&1 &
  local launcher_pid=$!
  for _ in $(seq 1 200); do grep -q ' yes$' "$work/log" && break; sleep 0.1; done
  grep -q ' yes$' "$work/log" || fail "the allreduce job did not start"
  kill_and_expect "$launcher_pid" "$victim_name" "chief 0" "worker 0" "worker 1" "worker 2"
}
kill_one "worker 1"
kill_one "chief 0"

# 3. SIGSTOP one worker (hung, not dead): the survivors lose it within the peer timeout; the launcher names
# the stopped worker as the cause, not the first survivor to exit, and kills it once the others have ended.
COHORT_PEER_TIMEOUT=2s COHORT_HEARTBEAT_INTERVAL=200ms \
  "$launcher" --workers 3 --grace 60 -- "$bench" --min-bytes 1048576 --max-bytes 4194304 --forever >"$work/log" 2>&1 &
launcher_pid=$!
for _ in $(seq 1 200); do grep -q ' yes$' "$work/log" && break; sleep 0.1; done
grep -q ' yes$' "$work/log" || fail "the allreduce job did not start"
victim=$(pid_of "worker 1")
stopped_at=$(date +%s)
kill -STOP "$victim"
wait "$launcher_pid"
status=$?
elapsed=$(( $(date +%s) - stopped_at ))
[ $status -ne 0 ] || fail "launcher succeeded although worker 1 hung"
[ $elapsed -le 15 ] || fail "the job took $elapsed s to end after worker 1 was stopped (grace 60 s)"
grep -q "failed: worker 1 (pid $victim) is stopped (signal 19, .*) and was reported lost by" "$work/log" ||
  fail "the summary does not blame the stopped worker 1"
for survivor in "chief 0" "worker 0"; do
  grep -q "^\[$survivor\] .*lost worker 1" "$work/log" || fail "$survivor did not name the lost worker 1"
done
kill -0 "$victim" 2>/dev/null && fail "the stopped worker 1 survived the launcher"

# 4. Over TLS (COHORT_TLS=1): every allreduce of a sweep is correct, and the chief says how it encrypts.
COHORT_TLS=1 timeout 120 "$launcher" --workers 3 -- "$bench" --min-bytes 4096 --max-bytes 4194304 >"$work/log" 2>&1 ||
  fail "the allreduce sweep over TLS failed"
grep -q 'connections: TLS 1.3, keyed from the shared secret' "$work/log" || fail "the chief did not report TLS"
grep -q ' no$' "$work/log" && fail "an allreduce over TLS gave a wrong result"
[ "$(grep -c ' yes$' "$work/log")" -ge 10 ] || fail "the sweep over TLS is incomplete"
grep -q '\[chief 0\] .*shared memory with 2 of the 2 peer(s) on its host' "$work/log" || fail "the ranks did not share memory"
# Sibling processes may read each other's memory where Yama does not restrict tracing to descendants.
if [ "$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0)" = 0 ]; then
  grep -q '\[chief 0\] .*peer(s) on its host (2 read its messages from 8388608 bytes straight from its memory)' "$work/log" ||
    fail "the ranks did not read large messages from each other's memory"
fi
COHORT_SINGLE_COPY=0 timeout 60 "$launcher" --workers 2 -- "$bench" --min-bytes 4096 --max-bytes 1048576 >"$work/log" 2>&1 ||
  fail "the allreduce sweep without single copy failed"
grep -q '(0 read its messages from 0 bytes' "$work/log" && ! grep -q ' no$' "$work/log" || fail "the sweep without single copy is wrong"

# 4b. COHORT_SHARED_MEMORY=0: every rank says its same-host peers are reached over TCP, and the sweep is correct.
COHORT_SHARED_MEMORY=0 timeout 60 "$launcher" --workers 2 -- "$bench" --min-bytes 4096 --max-bytes 65536 >"$work/log" 2>&1 ||
  fail "the allreduce sweep over TCP failed"
[ "$(grep -c 'shared memory is off (COHORT_TRANSPORT=tcp or COHORT_SHARED_MEMORY=0)' "$work/log")" -eq 2 ] || fail "shared memory off is not logged by every rank"
grep -q '# cohort allreduce over TCP' "$work/log" && ! grep -q ' no$' "$work/log" || fail "the sweep over TCP is wrong"
# COHORT_TRANSPORT names the transport from the registry; a name none is registered under is refused naming those there are.
COHORT_TRANSPORT=tcp timeout 60 "$launcher" --workers 2 -- "$bench" --min-bytes 4096 --max-bytes 4096 >"$work/log" 2>&1 ||
  fail "the allreduce sweep with COHORT_TRANSPORT=tcp failed"
grep -q '# cohort allreduce over TCP' "$work/log" || fail "COHORT_TRANSPORT=tcp did not choose TCP"
! COHORT_TRANSPORT=pigeon timeout 60 "$launcher" --workers 2 -- "$bench" --min-bytes 4096 --max-bytes 4096 >"$work/log" 2>&1 ||
  fail "an unknown transport was accepted"
grep -q "no transport named 'pigeon'; there are shared-memory, tcp" "$work/log" || fail "an unknown transport is not named: $(cat "$work/log")"

# 5. Ctrl-C stops everything.
"$launcher" --workers 2 -- sleep 30 >"$work/log" 2>&1 &
launcher_pid=$!
for _ in $(seq 1 50); do grep -q 'started' "$work/log" && break; sleep 0.1; done
children=$(grep -o '(pid [0-9]*)' "$work/log" | grep -o '[0-9]*')
[ -n "$children" ] || fail "no child pids reported"
kill -INT "$launcher_pid"
wait "$launcher_pid"
status=$?
[ $status -eq 130 ] || fail "launcher exit status $status after SIGINT"
for pid in $children; do kill -0 "$pid" 2>/dev/null && fail "child $pid survived SIGINT"; done
# 6. --gpus: workers take turns over the GPUs, parameter servers get none; the launcher's own list is used,
# its entries trimmed; lists that hide every GPU are refused; workers know their local rank.
show_gpus='echo "gpus=[$CUDA_VISIBLE_DEVICES] local=[${LOCAL_RANK-}/${LOCAL_WORLD_SIZE-}]"'
CUDA_VISIBLE_DEVICES='0, 1' timeout 30 "$launcher" --workers 3 --ps 1 --gpus 2 -- sh -c "$show_gpus" >"$work/log" 2>&1 ||
  fail "launcher with --gpus failed"
for expected in 'chief 0] gpus=[0] local=[0/3]' 'worker 0] gpus=[1] local=[1/3]' 'worker 1] gpus=[0] local=[2/3]' \
                'ps 0] gpus=[] local=[/]'; do
  grep -qxF "[$expected" "$work/log" || fail "--gpus 2: no line '[$expected'"
done
grep -q 'cohort-launch: chief 0 -> GPU 0, worker 0 -> GPU 1, worker 1 -> GPU 0, ps 0 -> no GPU' "$work/log" ||
  fail "--gpus: the assignment is not printed"
CUDA_VISIBLE_DEVICES=5,7 timeout 30 "$launcher" --workers 2 --gpus 2 -- sh -c "$show_gpus" >"$work/log" 2>&1 ||
  fail "launcher with --gpus under CUDA_VISIBLE_DEVICES failed"
grep -qF '[chief 0] gpus=[5]' "$work/log" && grep -qF '[worker 0] gpus=[7]' "$work/log" ||
  fail "--gpus does not use the launcher's CUDA_VISIBLE_DEVICES"
CUDA_VISIBLE_DEVICES=3 timeout 30 "$launcher" --workers 2 --gpus 2 -- true >"$work/log" 2>&1 &&
  fail "--gpus 2 with one visible GPU was accepted"
grep -q 'names only 1' "$work/log" || fail "--gpus beyond CUDA_VISIBLE_DEVICES is not explained"
for hidden in "" "-1" "NoDevFiles" "0,,1"; do
  CUDA_VISIBLE_DEVICES=$hidden timeout 30 "$launcher" --workers 2 --gpus 1 -- true >"$work/log" 2>&1 &&
    fail "--gpus accepted CUDA_VISIBLE_DEVICES='$hidden'"
  grep -q "gives this launcher no usable GPU list" "$work/log" || fail "CUDA_VISIBLE_DEVICES='$hidden' is not explained"
done
timeout 30 "$launcher" --workers 2 --gpus "" -- true >"$work/log" 2>&1 && fail "--gpus '' was accepted"

# 7. Output: lines written in pieces on stdout and stderr by four processes at once come out whole, each
# prefixed, on the stream they were written to; a last line without a newline too.
cat >"$work/chatty.sh" <<'EOF'
#!/bin/sh
id=$(echo "$TF_CONFIG" | sed 's/.*"type": "\([a-z]*\)", "index": \([0-9]*\).*/\1\2/')
i=0
while [ $i -lt 300 ]; do
  printf 'out-%s-%d-' "$id" $i; printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'; printf 'end\n'
  printf 'err-%s-%d-' "$id" $i >&2; printf 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' >&2; printf 'end\n' >&2
  i=$((i+1))
done
printf 'last-%s' "$id"
EOF
chmod +x "$work/chatty.sh"
timeout 60 "$launcher" --workers 3 --ps 1 -- "$work/chatty.sh" >"$work/out" 2>"$work/err" || fail "the chatty job failed"
names='(chief 0|worker [01]|ps 0)'
ids='(chief0|worker[01]|ps0)'
bad_out=$(grep -v -E "^\[$names\] (out-$ids-[0-9]+-a{60}end|last-$ids)\$" "$work/out" | head -3)
bad_err=$(grep -v -E "^\[$names\] err-$ids-[0-9]+-b{51}end\$|^cohort-launch: " "$work/err" | head -3)
[ -z "$bad_out" ] || fail "split, merged or unprefixed stdout lines: $bad_out"
[ -z "$bad_err" ] || fail "split, merged or unprefixed stderr lines: $bad_err"
[ "$(grep -c 'out-' "$work/out")" -eq 1200 ] || fail "stdout lines were lost: $(grep -c out- "$work/out") of 1200"
[ "$(grep -c 'err-' "$work/err")" -eq 1200 ] || fail "stderr lines were lost: $(grep -c err- "$work/err") of 1200"
[ "$(grep -c 'last-' "$work/out")" -eq 4 ] || fail "a last line without a newline was lost"
# Help goes to stdout with status 0; a bad value is one line naming the option, status 2.
{ "$launcher" --help >"$work/out" 2>"$work/err" && grep -q -- '--workers' "$work/out" && [ ! -s "$work/err" ]; } ||
  fail "--help does not print the options to stdout"
"$launcher" --workers=abc -- true >"$work/out" 2>"$work/err"
{ [ $? -eq 2 ] && [ "$(wc -l <"$work/err")" -eq 1 ] && grep -q -- '--workers' "$work/err"; } || fail "a bad --workers is not one line naming it"
"$launcher" --host localhost -- true >/dev/null 2>&1 || fail "--host localhost is refused"
# A program that cannot run is refused before any process starts, naming why; the thread default is said.
for missing in "$work/no-such-program" no-such-program-on-path "$work"; do
  "$launcher" --workers 2 -- "$missing" >"$work/out" 2>"$work/err"
  { [ $? -eq 2 ] && grep -q "cannot run $missing: " "$work/err" && ! grep -q 'started' "$work/err"; } ||
    fail "a program that cannot run ($missing) is not refused up front: $(cat "$work/err")"
done
env -u OMP_NUM_THREADS "$launcher" --workers 2 --ps 1 -- true >/dev/null 2>"$work/err" || fail "a job of true failed"
grep -q 'OMP_NUM_THREADS=[0-9]* for each worker, 1 for each parameter server' "$work/err" || fail "the thread default is not said"
OMP_NUM_THREADS=1 "$launcher" -- true >/dev/null 2>"$work/err"
! grep -q 'OMP_NUM_THREADS=' "$work/err" || fail "the thread default is said though OMP_NUM_THREADS is set"

# 8. On a terminal the chief's progress bar (a line redrawn with carriage returns) is shown live, before
# its newline arrives. `script` gives the launcher a pseudo-terminal.
if command -v script >/dev/null; then
  script -qec "$launcher -- sh -c 'printf \"\\rstep 1/3\"; sleep 0.3; printf \"\\rstep 2/3\"; sleep 0.3; printf \"\\rstep 3/3\\n\"'" \
    /dev/null >"$work/out" 2>&1 || fail "the job under a pseudo-terminal failed"
  grep -q 'chief 0\] step 2/3' "$work/out" || fail "the chief's live line was not shown before its end: $(tr '\r' '|' <"$work/out" | head -c 300)"
  grep -q 'chief 0\] step 3/3' "$work/out" || fail "the chief's finished line is missing"
fi

# 9. The benchmark's cross-core ceiling (cross_core.hpp): a round trip between two CPUs, and per size a copy of
# what the other core has just written, checked; on one CPU it says there is no such ceiling.
"$bench" --cores --min-bytes 4096 --max-bytes 1048576 >"$work/cores" 2>&1 || fail "--cores failed: $(head -c 400 "$work/cores")"
if [ "$(nproc)" -gt 1 ]; then
  grep -Eq '^# core to core: round trip [0-9]+ ns \(CPUs [0-9]+ and [0-9]+\)$' "$work/cores" || fail "--cores gave no round trip"
  [ "$(grep -Ec '^ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +yes$' "$work/cores")" -eq 9 ] ||
    fail "--cores did not copy 4 KiB to 1 MiB correctly: $(cat "$work/cores")"
  taskset -c 0 "$bench" --cores --max-bytes 4096 >"$work/cores" 2>&1 && grep -q 'one CPU only' "$work/cores" ||
    fail "--cores on one CPU: $(cat "$work/cores")"
fi

echo "launch_test: all checks passed"
