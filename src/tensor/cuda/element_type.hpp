#pragma once
// A tensor's element type as the CUDA types the kernels are templated on: float, __nv_bfloat16, __half.
//
//   with_element_type(x.dtype(), [&]<class T>(std::type_identity<T>) { kernels::multiply(in_as<T>(a), ...); });
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <type_traits>

#include "cohort/core/dtype.hpp"
#include "cohort/core/error.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cuda {

// Calls body(std::type_identity<T>{}) with T the CUDA type of `type`; int32 is no element type of a kernel.
template <class Body>
decltype(auto) with_element_type(DType type, Body&& body) {
  switch (type) {
    case DType::Float32: return body(std::type_identity<float>{});
    case DType::BFloat16: return body(std::type_identity<__nv_bfloat16>{});
    case DType::Float16: return body(std::type_identity<__half>{});
    default: throw InvalidArgument(fmt::format("the CUDA kernels take no {} operands", dtype_name(type)));
  }
}

template <class T>
const T* in_as(const Tensor& t) { return static_cast<const T*>(device_bytes(t)); }
template <class T>
T* out_as(const Tensor& t) { return t.defined() ? static_cast<T*>(device_bytes(t)) : nullptr; }

// cuDNN's name of an element type.
template <class T>
constexpr cudnnDataType_t cudnn_type() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDNN_DATA_BFLOAT16;
  else if constexpr (std::is_same_v<T, __half>) return CUDNN_DATA_HALF;
  else return CUDNN_DATA_FLOAT;
}

// The element type T is.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::BFloat16;
  else if constexpr (std::is_same_v<T, __half>) return DType::Float16;
  else return DType::Float32;
}

}  // namespace cohort::cuda
