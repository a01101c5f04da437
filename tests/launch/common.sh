# Shared by the launcher tests (sourced): they set $work, a scratch directory whose "log" holds the
# launcher's output.

fail() { echo "FAIL: $*"; echo "--- log"; cat "$work/log" 2>/dev/null; exit 1; }

# The pid the launcher reported for a process ("worker 1").
pid_of() { grep -o "$1 (pid [0-9]*)" "$work/log" | head -1 | grep -o '[0-9]*)' | tr -d ')'; }

# kill_and_expect LAUNCHER_PID VICTIM SURVIVOR...: SIGKILL the victim of a running job. The launcher must
# fail within 30 s saying the victim was killed, and every survivor must name the lost victim in its own
# output and exit by itself.
kill_and_expect() {
  local launcher_pid=$1 victim_name=$2
  shift 2
  local victim
  victim=$(pid_of "$victim_name")
  [ -n "$victim" ] || fail "no pid for $victim_name"
  local killed_at
  killed_at=$(date +%s)
  kill -9 "$victim"
  wait "$launcher_pid"
  local status=$?
  local elapsed=$(( $(date +%s) - killed_at ))
  [ $status -ne 0 ] || fail "launcher succeeded although $victim_name was killed"
  [ $elapsed -le 30 ] || fail "the job took $elapsed s to end after the kill of $victim_name"
  grep -q "failed: $victim_name (pid [0-9]*) was killed by signal 9" "$work/log" || fail "summary does not say $victim_name was killed"
  local survivor
  for survivor in "$@"; do
    [ "$survivor" = "$victim_name" ] && continue
    grep -q "^\[$survivor\] .*lost $victim_name" "$work/log" || fail "$survivor did not name the lost $victim_name"
  done
  grep -q 'stopped [0-9]* that did not exit' "$work/log" && fail "survivors had to be stopped instead of failing by themselves"
  return 0
}
