#!/usr/bin/env bash
# The Winograd kernels compiled per instruction set must share no inline or template function with the rest
# of the program: the linker keeps one copy of such a function for all callers, and if it kept the AVX-512
# one, a processor without AVX-512 would crash in code that never asked for it. Each object may define only
# its own table (winograd_kernels_<isa>) and local symbols.
#   tests/tensor/variant_symbols.sh OBJECT...
set -euo pipefail
failed=0
for object in "$@"; do
  shared=$(nm -C --defined-only "$object" | awk '$2 !~ /^[tdbrn]$/' | grep -v -e 'winograd_kernels_' -e 'DW.ref.__gxx_personality_v0' || true)
  if [ -n "$shared" ]; then
    echo "variant_symbols: $object defines symbols other objects may bind to:" >&2
    echo "$shared" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] && echo "variant_symbols: $# objects, only their tables shared"
exit "$failed"
