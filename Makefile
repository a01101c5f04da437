# Entry points: `make demo` runs the flagship example, `make test` builds everything and runs the suite.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	@scripts/setup-debian

configure: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

demo: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cifar10
	@$(BUILD_DIR)/examples/cifar10/cifar10 --demo $(DEMO_ARGS)

bench: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target cohort_bench
	@benchmarks/run_all.sh $(BUILD_DIR)

clean:
	@rm -rf $(BUILD_DIR)
