// Device storage: allocators, moves between devices, asynchronous copies, and what host code may touch.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/tensor/allocator.hpp"
#include "cohort/core/config.hpp"
#include "cohort/tensor/copy_stream.hpp"
#include "cohort/tensor/devices.hpp"
#include "cohort/tensor/ops.hpp"
#include "helper_process.hpp"
#include "tensor/backend.hpp"
#include "test_util.hpp"

using namespace cohort;

namespace {

// The GPU's choices in a process of its own, since the GPU's taking them holds for the process's life. Exit
// status 0 when the scenario behaves: "default" (TF32 allowed, deterministic algorithms), "environment off"
// (COHORT_ALLOW_TF32=0 is strict FP32 until allow_tf32(true)), "fastest algorithms" (COHORT_DETERMINISTIC=0
// alone), "taken" (after the GPU took strict FP32 and
// the fastest algorithms only those choices are accepted).
int gpu_choice(const std::string& scenario) {
  if (scenario == "default") return tf32_allowed() && deterministic_algorithms() ? 0 : 1;
  if (scenario == "fastest algorithms") return tf32_allowed() && !deterministic_algorithms() ? 0 : 1;
  if (scenario == "environment off") {
    if (tf32_allowed()) return 2;
    allow_tf32(true);
    return tf32_allowed() ? 0 : 3;
  }
  if (scenario == "taken") {
    allow_tf32(false);
    use_deterministic_algorithms(false);
    const GpuChoices taken = gpu_choices_from_now_on();
    if (taken.tf32 || taken.deterministic) return 4;
    allow_tf32(false);
    use_deterministic_algorithms(false);
    try {
      allow_tf32(true);
      return 5;
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("already computes with TF32 off (strict FP32)") == std::string::npos) return 6;
    }
    try {
      use_deterministic_algorithms(true);
      return 7;
    } catch (const InvalidArgument& e) {
      return std::string(e.what()).find("already computes with the fastest algorithms") != std::string::npos ? 0 : 8;
    }
  }
  return 9;
}

const bool gpu_choice_registered = cohort_test::register_helper("gpu-choice", gpu_choice);

// Runs the helper above for `scenario` with `setting` ("NAME=VALUE") as the only one of the GPU's variables
// in its environment (none when null); its exit status.
int run_gpu_choice(const char* scenario, const char* setting) {
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable)
    if (std::strncmp(*variable, "COHORT_ALLOW_TF32=", 18) != 0 && std::strncmp(*variable, "COHORT_DETERMINISTIC=", 21) != 0)
      environment.emplace_back(*variable);
  if (setting != nullptr) environment.emplace_back(setting);
  std::vector<char*> pointers;
  for (std::string& variable : environment) pointers.push_back(variable.data());
  pointers.push_back(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execle("/proc/self/exe", "cohort_tests", "--helper", "gpu-choice", scenario, static_cast<char*>(nullptr),
             pointers.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("TF32 and deterministic algorithms are the GPU's defaults, changed by the environment or a call before "
          "its first use only", "[tensor][device]") {
  CHECK(run_gpu_choice("default", nullptr) == 0);
  CHECK(run_gpu_choice("default", "COHORT_ALLOW_TF32=1") == 0);
  CHECK(run_gpu_choice("environment off", "COHORT_ALLOW_TF32=0") == 0);
  CHECK(run_gpu_choice("fastest algorithms", "COHORT_DETERMINISTIC=0") == 0);
  CHECK(run_gpu_choice("taken", nullptr) == 0);
  CHECK(run_gpu_choice("default", "COHORT_ALLOW_TF32=0") == 1);  // the checks above can fail
  CHECK(run_gpu_choice("default", "COHORT_DETERMINISTIC=0") == 1);
}

TEST_CASE("the caching allocator reuses freed blocks of a size class and keeps statistics", "[tensor][device]") {
  CachingAllocator allocator(std::make_unique<HostAllocator>("test"));
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(4096) == 4096);
  CHECK(CachingAllocator::size_class(4097) == 5120);
  CHECK(CachingAllocator::size_class(1 << 20) == std::size_t{1} << 20);
  CHECK(CachingAllocator::size_class((1 << 20) + 1) == (std::size_t{1} << 20) + (std::size_t{1} << 18));
  void* a = allocator.allocate(5000);
  void* b = allocator.allocate(100);
  CHECK(allocator.stats().in_use == 5120 + 512);
  allocator.deallocate(a, 5000);
  CHECK(allocator.stats().cached == 5120);
  void* again = allocator.allocate(4500);  // same class: the freed block comes back
  CHECK(again == a);
  CHECK(allocator.stats().upstream_allocations == 2);
  CHECK(allocator.stats().peak == 5120 + 512);
  allocator.deallocate(again, 4500);
  allocator.deallocate(b, 100);
  CHECK(allocator.stats().in_use == 0);
  CHECK(allocator.stats().cached == 5120 + 512);
  allocator.release_cached();
  CHECK(allocator.stats().cached == 0);
}

TEST_CASE("tensors move between devices and keep their values", "[tensor][device]") {
  const Tensor host = test_util::random_tensor({3, 5}, 1);
  const Tensor device = host.to(Device::Emulated);
  CHECK(device.device() == Device::Emulated);
  CHECK(!device.shares_storage_with(host));
  CHECK(host.to(Device::CPU).shares_storage_with(host));
  CHECK(device.to_vector() == host.to_vector());
  const Tensor copy = device.clone();
  CHECK(copy.device() == Device::Emulated);
  CHECK(!copy.shares_storage_with(device));
  CHECK(copy.slice(1, 2).to_vector() == host.slice(1, 2).to_vector());
  CHECK(Tensor({4}, Device::Emulated).to_vector() == std::vector<float>(4, 0.0f));  // zero-filled there too
  const AllocatorStats stats = allocator_for(Device::Emulated).stats();
  CHECK(stats.in_use > 0);
  CHECK(stats.peak >= stats.in_use);
}

TEST_CASE("host access to device memory is caught, and mixed devices are refused by name", "[tensor][device]") {
  const Tensor device({2, 3}, Device::Emulated);
  CHECK_THROWS_AS(device.data(), DeviceError);
  CHECK_THROWS_WITH(device.values(), Catch::Contains("host access to a tensor of shape (2, 3) on emulated"));
  const Tensor host({2, 3});
  CHECK_NOTHROW(host.data());
  CHECK_THROWS_AS(ops::axpy(1.0f, host, device), DeviceError);
  CHECK_THROWS_WITH(ops::multiply(host, device, host),
                    Catch::Contains("multiply") && Catch::Contains("(2, 3) on cpu") && Catch::Contains("(2, 3) on emulated"));
  CHECK_NOTHROW(ops::copy(host, device));  // the one op that crosses devices
}

TEST_CASE("a device this process cannot use is refused with the reason", "[tensor][device]") {
  // COHORT_HAS_CUDA is true exactly when the CUDA backend is built: then only a missing GPU can stop it.
  if (device_available(Device::CUDA)) {
    CHECK(COHORT_HAS_CUDA);
    CHECK_NOTHROW(Tensor({2}, Device::CUDA));
    CHECK(choose_device("auto") == Device::CUDA);
  } else {
    const std::string reason = COHORT_HAS_CUDA ? "no CUDA device is visible to this process"
                                               : "no cuda backend: configure with -DCOHORT_WITH_CUDA=ON";
    CHECK_THROWS_WITH(Tensor({2}, Device::CUDA), Catch::Contains(reason));
    CHECK_THROWS_WITH(choose_device("cuda"), Catch::Contains(reason));
    CHECK_THROWS_AS(nn::Sequential({4}, 0, Device::CUDA), DeviceError);
    CHECK(choose_device("auto") == Device::CPU);
  }
  CHECK(device_available(Device::CPU));
  CHECK(device_available(Device::Emulated));
  CHECK(choose_device("cpu") == Device::CPU);
  CHECK(choose_device("emulated") == Device::Emulated);
  CHECK_THROWS_WITH(choose_device("gpu"), Catch::Contains("unknown device 'gpu': use cpu, cuda, emulated or auto"));
  CopyStream stream(Device::Emulated);
  CHECK_THROWS_WITH(stream.copy(Tensor({2}), Tensor({2})), Catch::Contains("does not touch this stream's device"));
}

TEST_CASE("a copy stream copies asynchronously and guards tensors in flight", "[tensor][device][threads]") {
  const Tensor host = test_util::random_tensor({64, 33}, 2);
  const Tensor device = Tensor::uninitialized(host.shape(), Device::Emulated);
  CopyStream stream(Device::Emulated);
  stream.copy(host, device);
  CHECK(device.copy_in_flight());
  CHECK(host.copy_in_flight());
  CHECK_THROWS_AS(ops::scale(device, 2.0f), DeviceError);  // half-copied values are never read
  CHECK_THROWS_AS(device.to(Device::CPU), DeviceError);
  CHECK_THROWS_AS(stream.copy(host, device), DeviceError);  // two copies into one tensor at once
  CHECK_THROWS_AS(stream.copy(device, Tensor::pinned(host.shape())), DeviceError);  // reading what is being written
  CHECK_THROWS_AS(host.data(), DeviceError);                                        // even the source, on the host
  const Tensor second = Tensor::uninitialized(host.shape(), Device::Emulated);
  stream.copy(host, second);  // a source may feed several copies
  stream.synchronize();
  CHECK(second.to_vector() == host.to_vector());
  CHECK(!device.copy_in_flight());
  CHECK(device.to_vector() == host.to_vector());
  // Back to pinned host memory.
  const Tensor back = Tensor::pinned(host.shape());
  stream.copy(device, back);
  stream.synchronize();
  CHECK(back.to_vector() == host.to_vector());
  CHECK_THROWS_AS(stream.copy(host, Tensor({64, 32}, Device::Emulated)), InvalidArgument);
}

TEST_CASE("absurd tensor sizes are refused before any allocation", "[tensor][device]") {
  CHECK_THROWS_AS(Tensor({std::int64_t{1} << 40, std::int64_t{1} << 40}), InvalidArgument);
  CHECK_THROWS_AS(Tensor({std::int64_t{1} << 62, 4}, Device::Emulated), InvalidArgument);
  CHECK_THROWS_AS(CachingAllocator::size_class(std::numeric_limits<std::size_t>::max()), DeviceError);
}
