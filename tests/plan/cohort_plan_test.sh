#!/usr/bin/env bash
# cohort-plan from the command line: a plan from a saved profile (text and JSON), one with the link measured
# between two processes under cohort-launch, and one line with status 2 for what cannot be planned.
#   usage: cohort_plan_test.sh COHORT_PLAN COHORT_LAUNCH
set -uo pipefail
plan=$1 launch=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

timeout 120 "$plan" --model small_cnn --batch-size 16 --workers 2 --bandwidth 1Gbit --profile-steps 1 \
  --save-profile "$work/profile.json" >"$work/measured" 2>&1 || { cat "$work/measured"; fail "a measured plan failed"; }
grep -q '^recommended: ' "$work/measured" || fail "no recommendation: $(cat "$work/measured")"
grep -q '"backward_seconds"' "$work/profile.json" || fail "no profile saved"
output=$(timeout 60 "$plan" --model small_cnn --workers 4 --bandwidth 100Mbit --latency 1ms --profile "$work/profile.json" --json) ||
  fail "a plan from a saved profile failed: $output"
grep -q '"recommended": "' <<<"$output" && grep -q '"strategy": "parameter servers (4, size-balanced)"' <<<"$output" ||
  fail "the JSON plan lacks its recommendation or the 4-server setup: $output"

# The link measured between chief 0 and worker 0 on loopback, then the plan on it (JSON on stdout, the
# measurement on stderr).
timeout 120 "$launch" --workers 2 -- "$plan" --measure-link --model small_cnn --workers 4 --profile "$work/profile.json" --json \
  >"$work/launched" 2>&1 || { cat "$work/launched"; fail "a plan on a measured link failed"; }
grep -Eq 'the link to worker 0 measured [0-9.]+ MB/s each way \(the slower way\), [0-9.]+ us per message' "$work/launched" ||
  fail "no measured link: $(cat "$work/launched")"
grep -q '"bandwidth_bytes_per_second": [1-9]' "$work/launched" || fail "the plan does not use the measured link: $(cat "$work/launched")"

refused() {  # EXPECTED ARGS...: status 2 and one line holding EXPECTED
  local expected=$1
  shift
  local said status
  said=$(timeout 60 "$plan" "$@" 2>&1)
  status=$?
  [ $status -eq 2 ] || fail "cohort-plan $* ended with status $status, not 2: $said"
  [ "$(wc -l <<<"$said")" -eq 1 ] || fail "cohort-plan $* said more than one line: $said"
  grep -qF -- "$expected" <<<"$said" || fail "cohort-plan $* did not say '$expected': $said"
}
refused "--model resnet9000: neither a zoo model (cifar10_cnn, small_cnn) nor a model file" --model resnet9000 --workers 2 --bandwidth 1Gbit
refused "bandwidth '0': a link must carry more than 0 bytes per second" --workers 2 --bandwidth 0
refused "--workers: needs a whole number from 1 to 4096, got '0'" --workers 0 --bandwidth 1Gbit
refused "'1 Gbit' is not a bandwidth" --workers 2 --bandwidth "1 Gbit"
refused "'fast' is not a latency" --workers 2 --bandwidth 1Gbit --latency fast
refused "--bandwidth is required (or --measure-link between two hosts)" --workers 2
refused "--measure-link: " --workers 2 --measure-link  # no cluster in the environment
echo '{"batch_size": 0}' >"$work/bad.json"
refused "the compute profile's threads is missing" --workers 2 --bandwidth 1Gbit --profile "$work/bad.json"
echo "cohort_plan_test: all checks passed"
