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
refuses "--learning-rate: needs a positive finite number, got 'nan'" --learning-rate nan
refuses "--learning-rate: needs a positive finite number, got 'inf'" --learning-rate inf
refuses "--learning-rate: needs a positive finite number, got '-1'" --learning-rate -1
refuses "--learning-rate: needs a positive finite number, got 'nan'" --learning-rate=nan
refuses "--threads: needs a whole number from 0 to 4096, got '4294967297'" --threads 4294967297
refuses "--epochs: needs a whole number from 1 to 1099511627776, got '99999999999999999999'" --epochs 99999999999999999999
refuses "--batch-size: needs a whole number from 1 to 16777216, got 'abc'" --batch-size abc
refuses "--epochs: needs a whole number from 1 to 1099511627776, got '3x'" --epochs=3x
refuses "--device: gpu not in {cpu,cuda,auto,emulated}" --device gpu
refuses "--placement: placement policy 'RoundRobin': expected round-robin, size-balanced or tensorflow-greedy" --placement RoundRobin
refuses "--consistency: consistency 'stale:x'" --consistency stale:x
refuses "--accumulate-steps: needs a whole number from 1 to 1048576, got '0'" --accumulate-steps 0
refuses "--bogus" --bogus
# One line, not the whole usage.
[ "$(timeout 30 "$example" --bogus 2>&1 | wc -l)" -eq 1 ] || fail "a mistake prints more than one line"
timeout 30 "$example" --help | grep -q -- '--each-worker-full-pass' || fail "--help does not list the options on stdout"
timeout 30 "$example" --help | grep -q -- '--timeline' || fail "--help does not list --timeline"
echo "options_test: all checks passed"
