#pragma once
// Every CUDA runtime, cuBLAS and cuDNN call of the backend goes through COHORT_CUDA_CHECK: a failure
// becomes a DeviceError naming the call, the library's own message and what the backend was doing
// (the op and its shapes), formatted only when the call failed.
//
//   COHORT_CUDA_CHECK(cudaMemcpyAsync(...), "copy_to_host of {}", source.shape());
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "cohort/core/check.hpp"
#include "cohort/core/error.hpp"

namespace cohort::cuda {

[[noreturn]] void throw_device_error(std::string_view call, std::string_view reason, const std::string& context);

std::string_view cublas_status_name(cublasStatus_t status);

template <class Context>
void check_status(cudaError_t status, std::string_view call, Context&& context) {
  if (status == cudaSuccess) [[likely]] return;
  // A failed allocation or launch configuration leaves no sticky error; clear it so the next call is clean.
  cudaGetLastError();
  throw_device_error(call, fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status)), context());
}

template <class Context>
void check_status(cublasStatus_t status, std::string_view call, Context&& context) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]] return;
  throw_device_error(call, cublas_status_name(status), context());
}

template <class Context>
void check_status(cudnnStatus_t status, std::string_view call, Context&& context) {
  if (status == CUDNN_STATUS_SUCCESS) [[likely]] return;
  throw_device_error(call, cudnnGetErrorString(status), context());
}

}  // namespace cohort::cuda

#define COHORT_CUDA_CHECK(call, ...) \
  ::cohort::cuda::check_status((call), #call, [&]() -> std::string { return fmt::format(__VA_ARGS__); })
