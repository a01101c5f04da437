#!/usr/bin/env bash
# The examples refuse bad option values with one clear line and exit status 2, before any work.
#   usage: options_test.sh EXAMPLE [FLAGSHIP_EXAMPLE]
set -uo pipefail
example=$1 flagship=${2:-}
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
refuses "--precision: bfloat16 not in {float32,mixed_bfloat16,mixed_float16}" --precision bfloat16
refuses "--gradient-dtype: float16 not in {float32,bfloat16}" --gradient-dtype float16
refuses "--shard-optimizer: zero3 not in {none,zero1,zero2}" --shard-optimizer zero3
refuses "--gradient-codec: gradient codec 'powersgd:0': expected powersgd or powersgd:R" --gradient-codec powersgd:0
refuses "--save-model /: it exists and is not a regular file" --save-model /
refuses "--history-csv /dev/null: it exists and is not a regular file" --history-csv /dev/null
refuses "--report /nonexistent/run.html: there is no directory /nonexistent" --report /nonexistent/run.html
refuses "--report /tmp: it exists and is not a regular file" --report /tmp
refuses "--report /proc/run.html: no file can be made in /proc" --report /proc/run.html
refuses "--timeline /nonexistent/trace.json: there is no directory /nonexistent" --timeline /nonexistent/trace.json
refuses "--tensorboard /dev/null/logs: cannot make that directory" --tensorboard /dev/null/logs
refuses "--tensorboard-every: needs a whole number" --tensorboard-every -3
refuses "--placement: placement policy 'RoundRobin': expected round-robin, size-balanced or tensorflow-greedy" --placement RoundRobin
refuses "--consistency: consistency 'stale:x'" --consistency stale:x
refuses "--accumulate-steps: needs a whole number from 1 to 1048576, got '0'" --accumulate-steps 0
refuses "--bogus" --bogus
# Settings from the environment: a spelling outside the documented ones is refused at once, in one line.
refuses_setting() {  # refuses_setting EXPECTED_TEXT NAME=VALUE
  local output status
  output=$(env "$2" timeout 30 "$example" --epochs 1 2>&1)
  status=$?
  [ $status -eq 2 ] || fail "$2 exited with $status, expected 2"
  [ "$(wc -l <<<"$output")" -eq 1 ] || fail "$2 printed more than one line: $(head -3 <<<"$output")"
  grep -qF -- "$1" <<<"$output" || fail "$2 did not say '$1': $output"
}
refuses_setting "COHORT_RESTART='false'" COHORT_RESTART=false
refuses_setting "COHORT_HIERARCHICAL_ALLREDUCE='off'" COHORT_HIERARCHICAL_ALLREDUCE=off
refuses_setting "COHORT_GEMM='foo': use eigen, openblas, fastest" COHORT_GEMM=foo
refuses_setting "COHORT_BF16_KERNELS='onednn': use native, float32" COHORT_BF16_KERNELS=onednn
refuses_setting "COHORT_CPU_ISA='foo': use portable, avx2, avx512" COHORT_CPU_ISA=foo
refuses_setting "COHORT_TIMEOUT='soon' is not a duration between 1ms and 24h" COHORT_TIMEOUT=soon
# A data directory that is not there: the system's reason and how to get the data.
output=$(timeout 30 "$example" --epochs 1 --data-dir /nonexistent/fashion 2>&1)
[ $? -eq 1 ] || fail "a missing data directory did not end the program with status 1"
grep -qF "no Fashion-MNIST data: /nonexistent/fashion: No such file or directory" <<<"$output" &&
  grep -qF -- "--data-dir DIR" <<<"$output" && grep -qF "apt-get install dataset-fashion-mnist" <<<"$output" ||
  fail "a missing data directory is not explained: $output"
# The flagship, given a directory with neither data set, says so with the system's reason.
if [ -n "$flagship" ]; then
  output=$(timeout 30 "$flagship" --epochs 1 --data-dir /nonexistent/cifar 2>&1)
  [ $? -eq 1 ] || fail "the flagship with a missing data directory did not end with status 1"
  grep -qF -- "--data-dir /nonexistent/cifar holds neither the CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin) nor Fashion-MNIST: /nonexistent/cifar: No such file or directory" <<<"$output" ||
    fail "the flagship's missing data directory is not explained: $output"
  grep -qF "cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html" <<<"$output" &&
    grep -qF "without --data-dir the flagship trains on Debian's dataset-fashion-mnist" <<<"$output" ||
    fail "the flagship's missing data directory gives no way to get the data: $output"
fi
# On a device, replayed captures of the steps train as the steps op by op (--no-capture-steps).
accuracy_on_emulated() {
  timeout 300 "$example" --device emulated --epochs 1 --train-samples 640 --batch-size 64 --verbosity epochs "$@" 2>&1 |
    grep -o 'test accuracy [0-9.]*' | tail -1
}
captured=$(accuracy_on_emulated)
op_by_op=$(accuracy_on_emulated --no-capture-steps)
[ -n "$captured" ] && [ "$captured" = "$op_by_op" ] ||
  fail "captured steps gave '$captured', the same steps op by op '$op_by_op'"
# One line, not the whole usage.
[ "$(timeout 30 "$example" --bogus 2>&1 | wc -l)" -eq 1 ] || fail "a mistake prints more than one line"
# Read whole before searching: grep -q leaves at its match, and the rest would meet a closed pipe.
help=$(timeout 30 "$example" --help 2>/dev/null)
for option in --each-worker-full-pass --timeline --shard-optimizer --gradient-codec --no-capture-steps; do
  grep -q -- "$option" <<<"$help" || fail "--help does not list $option on stdout"
done
summary=$(timeout 60 "$example" --sync-batch-norm --summary)
grep -q 'sync_batch_normalization (SyncBatchNormalization)' <<<"$summary" ||
  fail "--sync-batch-norm does not build the model with SyncBatchNormalization"
echo "options_test: all checks passed"
