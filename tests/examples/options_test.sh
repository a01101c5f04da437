#!/usr/bin/env bash
# The examples refuse bad option values with one clear line and exit status 2, before any work.
#   usage: options_test.sh EXAMPLE
set -uo pipefail
example=$1
fail() { echo "FAIL: $*"; exit 1; }
refuses() {  # refuses EXPECTED_TEXT ARGS...
  local expected=$1
  shift
  local output status
  output=$(timeout 30 "$example" "$@" 2>&1)
  status=$?
  [ $status -eq 2 ] || fail "'$*' exited with $status, expected 2"
  grep -qF -- "$expected" <<<"$output" || fail "'$*' did not say '$expected': $(head -3 <<<"$output")"
}
refuses "--learning-rate needs a positive finite number, got 'nan'" --learning-rate nan
refuses "--learning-rate needs a positive finite number, got 'inf'" --learning-rate inf
refuses "--learning-rate needs a positive finite number, got '-1'" --learning-rate -1
refuses "--threads takes 0 (all cores) to 4096, got 4294967297" --threads 4294967297
refuses "--epochs needs a non-negative integer, got '99999999999999999999'" --epochs 99999999999999999999
refuses "--batch-size needs a non-negative integer, got 'abc'" --batch-size abc
refuses "--device takes cpu, cuda, auto or emulated" --device gpu
refuses "unknown option '--bogus'" --bogus
echo "options_test: all checks passed"
