#!/usr/bin/env bash
# The parts libcohort loads at run time (the CUDA backend, the MPI communicator): libcohort and a program
# need none of CUDA's, NCCL's or MPI's libraries; a part that is missing, one whose own library is missing,
# and one from another version of cohort are each named when first asked for, and the program fails
# cleanly. Runs a copy of libcohort from a scratch directory (LD_LIBRARY_PATH), beside stand-in parts.
#   usage: parts_test.sh EXAMPLE LIBCOHORT CXX HAS_CUDA HAS_MPI
set -uo pipefail
example=$1 libcohort=$2 cxx=$3 has_cuda=$4 has_mpi=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
args=(--epochs 1 --train-samples 256 --batch-size 64 --threads 1)

for file in "$libcohort" "$example"; do
  needs=$(ldd "$file")
  grep -E 'lib(cuda|cudart|cublas|cudnn|nccl|mpi)[^ ]*' <<<"$needs" && fail "$file needs a GPU or MPI library"
done
soname=$(readelf -d "$libcohort" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] || fail "libcohort has no SONAME"
cp -L "$libcohort" "$work/$soname"

# Runs the example on the copy; expects failure with EXPECTED in its output.
expect() {  # expect EXPECTED ENV... -- ARGS...
  local expected=$1 output status
  shift
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  output=$(env LD_LIBRARY_PATH="$work" "${env[@]}" timeout 60 "$example" "${args[@]}" "$@" 2>&1)
  status=$?
  [ $status -ne 0 ] && [ $status -ne 124 ] || fail "'$*' exited with $status: $output"
  grep -qF -- "$expected" <<<"$output" || fail "'${env[*]} $*' did not say '$expected': $(tail -3 <<<"$output")"
}

# A stand-in part whose own library is gone, as libcohort_cuda.so on a machine without cuDNN.
echo 'int cohort_missing_dependency = 1;' >"$work/missing.cpp"
"$cxx" -shared -fPIC -o "$work/libcohort_missing_dependency.so" "$work/missing.cpp" || fail "cannot build a stand-in"
# A stand-in from another version of cohort.
cat >"$work/other_version.cpp" <<'CPP'
struct Header { const char* version; int layout; };
static const Header header{"0.0.1", 1};
extern "C" const Header* cohort_cuda_plugin() { return &header; }
extern "C" const Header* cohort_mpi_plugin() { return &header; }
CPP

if [ "$has_cuda" = 1 ]; then
  expect "the CUDA backend is not installed: no libcohort_cuda.so next to libcohort ($work) nor on the loader's path (Debian: apt-get install cohort-cuda)" -- --device cuda
  "$cxx" -shared -fPIC -o "$work/libcohort_cuda.so" "$work/missing.cpp" -L"$work" -Wl,--no-as-needed -lcohort_missing_dependency || fail "cannot build a stand-in"
  mv "$work/libcohort_missing_dependency.so" "$work/libcohort_missing_dependency.so.keep"
  expect "the CUDA backend ($work/libcohort_cuda.so) is installed but cannot be loaded: libcohort_missing_dependency.so: cannot open shared object file" -- --device cuda
  # auto falls back to the CPU, saying why.
  output=$(LD_LIBRARY_PATH="$work" timeout 60 "$example" "${args[@]}" --device auto 2>&1) || fail "--device auto did not fall back to the CPU: $output"
  grep -qF "device: cpu (auto: the CUDA backend ($work/libcohort_cuda.so) is installed but cannot be loaded" <<<"$output" ||
    fail "--device auto did not say why it took the CPU: $(grep device: <<<"$output")"
  "$cxx" -shared -fPIC -o "$work/libcohort_cuda.so" "$work/other_version.cpp" || fail "cannot build a stand-in"
  expect "was built for cohort 0.0.1 (layout 1), this libcohort is " -- --device cuda
  mv "$work/libcohort_missing_dependency.so.keep" "$work/libcohort_missing_dependency.so"
else
  expect "this build of cohort has no cuda backend" -- --device cuda
fi

if [ "$has_mpi" = 1 ]; then
  expect "the MPI communicator is not installed: no libcohort_mpi.so next to libcohort" COHORT_COMMUNICATOR=mpi --
  "$cxx" -shared -fPIC -o "$work/libcohort_mpi.so" "$work/missing.cpp" -L"$work" -Wl,--no-as-needed -lcohort_missing_dependency || fail "cannot build a stand-in"
  rm "$work/libcohort_missing_dependency.so"
  expect "the MPI communicator ($work/libcohort_mpi.so) is installed but cannot be loaded: libcohort_missing_dependency.so" COHORT_COMMUNICATOR=mpi --
  "$cxx" -shared -fPIC -o "$work/libcohort_mpi.so" "$work/other_version.cpp" || fail "cannot build a stand-in"
  expect "the MPI communicator ($work/libcohort_mpi.so) was built for cohort 0.0.1" COHORT_COMMUNICATOR=mpi --
else
  expect "this build of cohort has no MPI communicator" COHORT_COMMUNICATOR=mpi --
fi
echo "parts test passed"
