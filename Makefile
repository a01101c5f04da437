# Entry points: `make demo` runs the flagship example, `make test` builds everything and runs the suite.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# This machine's instruction set: the build and its benchmarks stay here (installs default to portable code).
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DCOHORT_NATIVE_ARCH=ON

.PHONY: all deps configure build test demo install package bench bench-allreduce bench-startup bench-ps bench-data-parallel bench-codecs asan-build sanitize fuzz clean

all: build

deps:
	@scripts/setup-debian

configure: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# A portable library (no -march=native) in a build directory of its own, installed under PREFIX.
PREFIX ?= /usr/local
install: deps
	@cmake -S . -B build-install -DCMAKE_BUILD_TYPE=Release -DCOHORT_NATIVE_ARCH=OFF -DCOHORT_BUILD_TESTS=OFF \
	       -DCOHORT_BUILD_EXAMPLES=OFF -DCOHORT_BUILD_BENCHMARKS=OFF >/dev/null
	@cmake --build build-install -j $(JOBS)
	@cmake --install build-install --prefix $(PREFIX)

# Debian packages of a portable build (cohort, cohort-dev, and cohort-cuda / cohort-mpi where this machine
# builds those parts) in build-package/; scripts/package-check installs them in a fresh Debian root.
package: deps
	@cmake -S . -B build-package -DCMAKE_BUILD_TYPE=Release -DCOHORT_NATIVE_ARCH=OFF -DCOHORT_BUILD_TESTS=OFF \
	       -DCOHORT_BUILD_EXAMPLES=OFF -DCOHORT_BUILD_BENCHMARKS=OFF -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
	@cmake --build build-package -j $(JOBS)
	@cd build-package && cpack >/dev/null && ls -1 $$PWD/*.deb

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The flagship model on 2 workers + 2 parameter servers on loopback: placement table, progress, accuracy,
# per-server traffic.
demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cifar10 cohort-launch
	@$(BUILD_DIR)/cohort-launch --workers 2 --ps 2 -- $(BUILD_DIR)/examples/cifar10 --demo $(DEMO_ARGS)

# The CPU picture beside PyTorch (torch from PyPI into .venv-peers unless PYTHON names an interpreter that has it).
bench: configure
	@scripts/setup-debian --peers
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cohort_bench cohort_layer_profile
	@if [ -z "$(PYTHON)" ] && ! .venv-peers/bin/python -c 'import torch' 2>/dev/null; then \
	  (python3 -m venv .venv-peers && .venv-peers/bin/pip install -q torch numpy) || echo "(torch not installed)"; fi
	@PYTHON=$${PYTHON:-.venv-peers/bin/python} benchmarks/run_all.sh $(BUILD_DIR)

bench-allreduce:
	@scripts/setup-debian --peers
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cohort-launch cohort_allreduce_bench cohort_tls_bench mpi_allreduce_bench gloo_allreduce_bench
	@benchmarks/allreduce_compare.sh $(BUILD_DIR)

# A job's start-up on one host, 4 to 128 ranks: time to a first allreduce, descriptors, shared memory.
bench-startup:
	@scripts/setup-debian --peers
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cohort-launch cohort_allreduce_bench mpi_allreduce_bench
	@benchmarks/startup_compare.sh $(BUILD_DIR)

# Data-parallel training: ring allreduce on 1, 2, 4 workers and 2 + 2 parameter servers with the exposed
# communication from their timelines, beside PyTorch DDP (torch from PyPI as for make bench).
bench-data-parallel:
	@scripts/setup-debian --peers
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cifar10 cohort-launch
	@if [ -z "$(PYTHON)" ] && ! .venv-peers/bin/python -c 'import torch' 2>/dev/null; then \
	  (python3 -m venv .venv-peers && .venv-peers/bin/pip install -q torch numpy) || echo "(torch not installed)"; fi
	@PYTHON=$${PYTHON:-.venv-peers/bin/python} benchmarks/data_parallel_compare.sh $(BUILD_DIR)

# Parameter servers: push+pull GB/s, 2 workers + 2 ps against 1 process, and TensorFlow's parameter servers
# (tensorflow-cpu from PyPI into .venv-peers unless PYTHON names an interpreter that has it).
bench-codecs:
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target fashion_mnist cohort-launch
	@benchmarks/codec_compare.sh $(BUILD_DIR)

bench-ps:
	@scripts/setup-debian --peers
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cohort_ps_bench cifar10 cohort-launch
	@if [ -z "$(PYTHON)" ] && [ ! -x .venv-peers/bin/python ]; then \
	  python3 -m venv .venv-peers && .venv-peers/bin/pip install -q tensorflow-cpu || echo "(tensorflow-cpu not installed)"; fi
	@PYTHON=$${PYTHON:-.venv-peers/bin/python} benchmarks/ps_compare.sh $(BUILD_DIR)

# The suite again under AddressSanitizer + UndefinedBehaviorSanitizer (built with clang, whose libFuzzer
# instruments the same build), then every fuzz target for FUZZ_SECONDS each (scripts/fuzz), and the transport
# and collective tests and the parameter server spoken to by hand under ThreadSanitizer (OpenMP is not
# instrumented, so TSan covers the tests that do not train; its build compiles only those test files).
# -O1 -g1 (line tables): what the sanitizers need for their reports, at half the compile time of -O2 -g.
SANITIZE_FLAGS = -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1 -DNDEBUG" -DCOHORT_BUILD_EXAMPLES=OFF \
                 -DCOHORT_BUILD_BENCHMARKS=OFF -DCOHORT_WITH_CUDA=OFF
ASAN_FLAGS = -fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer -fno-sanitize-recover=undefined
FUZZ_SECONDS ?= 10

asan-build: deps
	@CC=clang CXX=clang++ cmake -S . -B build-asan-clang $(SANITIZE_FLAGS) -DCOHORT_BUILD_FUZZERS=ON -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" >/dev/null
	@cmake --build build-asan-clang -j $(JOBS) --target cohort_tests fuzzers

# [long]: a learning run of 70 s in `make test`, minutes under ASan, reaching no code the other training tests miss.
# The suite runs as two processes at once: the tests that wait on peers and deadlines, and the rest.
ASAN_HALVES = "[comm]~[long],[ps]~[long],[cluster]~[long]" "~[long]~[comm]~[ps]~[cluster]"
sanitize: asan-build
	@ASAN_OPTIONS=detect_leaks=1 scripts/run-in-parallel build-asan-clang/tests/cohort_tests $(ASAN_HALVES)
	@scripts/fuzz build-asan-clang $(FUZZ_SECONDS)
	@cmake -S . -B build-tsan $(SANITIZE_FLAGS) -DCOHORT_THREAD_TESTS_ONLY=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread" >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target cohort_tests
	@TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" build-tsan/tests/cohort_tests "[comm],[threads]"

# The fuzz targets for longer: make fuzz FUZZ_SECONDS=600
fuzz: FUZZ_SECONDS = 300
fuzz: asan-build
	@scripts/fuzz build-asan-clang $(FUZZ_SECONDS)

clean:
	@rm -rf $(BUILD_DIR) build-asan-clang build-tsan
