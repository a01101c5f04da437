#!/usr/bin/env bash
# flagship_throughput --largest-batch on the emulated device given COHORT_EMULATED_MEMORY: the batch it reports
# trains within that memory, one more does not (the device says it is out of memory), and more memory
# gives a larger batch.
#   usage: largest_batch_test.sh FLAGSHIP_THROUGHPUT
set -euo pipefail
program=$1
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
largest_batch() {
  local line
  line=$(COHORT_EMULATED_MEMORY=$1 timeout 120 "$program" --device emulated --largest-batch)
  sed -n 's/.*largest_batch=\([0-9]*\) step_peak_MiB=[0-9]*$/\1/p' <<<"$line" | grep . || fail "no largest batch in: $line"
}

largest=$(largest_batch 200000000)
[ "$largest" -ge 16 ] || fail "200 MB hold only a batch of $largest"
COHORT_EMULATED_MEMORY=200000000 timeout 120 "$program" --device emulated --batch "$largest" --seconds 0.01 >/dev/null ||
  fail "the largest batch, $largest, does not train in 200 MB"
if out=$(COHORT_EMULATED_MEMORY=200000000 timeout 120 "$program" --device emulated --batch $((largest + 1)) --seconds 0.01 2>&1); then
  fail "batch $((largest + 1)) trains in 200 MB, yet $largest was reported the largest"
fi
grep -q "emulated allocator: out of memory allocating" <<<"$out" || fail "batch $((largest + 1)) failed otherwise: $out"
more=$(largest_batch 400000000)
[ "$more" -gt $((largest * 3 / 2)) ] || fail "twice the memory, 400 MB, holds a batch of $more against $largest"

# The setting is a number of bytes; anything else is refused by name.
if out=$(COHORT_EMULATED_MEMORY=2GiB timeout 60 "$program" --device emulated --largest-batch 2>&1); then fail "2GiB accepted"; fi
grep -q "COHORT_EMULATED_MEMORY" <<<"$out" || fail "a malformed COHORT_EMULATED_MEMORY is not named: $out"
if out=$(timeout 60 "$program" --device cpu --largest-batch 2>&1); then fail "--largest-batch ran on the CPU"; fi
# Without a memory limit the emulated device would probe the host's memory.
if out=$(env -u COHORT_EMULATED_MEMORY timeout 60 "$program" --device emulated --largest-batch 2>&1); then
  fail "--largest-batch ran on an emulated device without a memory limit"
fi
grep -q "needs its memory set (COHORT_EMULATED_MEMORY=BYTES)" <<<"$out" || fail "no limit, unclear refusal: $out"
if out=$(timeout 60 "$program" --bogus 2>&1); then fail "--bogus accepted"; fi
grep -q "unknown option '--bogus'" <<<"$out" || fail "an unknown flag is not named: $out"
echo "largest batch: $largest in 200 MB, $more in 400 MB"
