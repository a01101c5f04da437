// Element-type conversion and zeroing for the CPU backend: the scalar rules of core/dtype.hpp over a tensor,
// split across the OpenMP thread budget when it is large. The rules are passed as lambdas, so that they are
// inlined into the loops: the bfloat16 ones are branch-free and vectorize.
#include <cstring>

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

constexpr std::int64_t kParallelThreshold = 1 << 15;

template <class From, class To, class Rule>
void convert_all(const void* from, void* to, std::int64_t n, Rule rule) {
  const auto* in = static_cast<const From*>(from);
  auto* out = static_cast<To*>(to);
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) out[i] = rule(in[i]);
}

}  // namespace

void CpuBackend::zero(const Tensor& x) {
  if (x.numel() > 0) std::memset(device_bytes(x), 0, x.bytes());
}

void CpuBackend::convert(const Tensor& source, const Tensor& destination) {
  const std::int64_t n = source.numel();
  const void* from = device_bytes(source);
  void* to = device_bytes(destination);
  const DType from_type = source.dtype();
  if (from_type == DType::Float32 && destination.dtype() == DType::BFloat16)
    return convert_all<float, std::uint16_t>(from, to, n, [](float v) { return to_bfloat16_bits(v); });
  if (from_type == DType::Float32 && destination.dtype() == DType::Float16)
    return convert_all<float, std::uint16_t>(from, to, n, [](float v) { return to_float16_bits(v); });
  if (from_type == DType::BFloat16 && destination.dtype() == DType::Float32)
    return convert_all<std::uint16_t, float>(from, to, n, [](std::uint16_t v) { return from_bfloat16_bits(v); });
  if (from_type == DType::Float16 && destination.dtype() == DType::Float32)
    return convert_all<std::uint16_t, float>(from, to, n, [](std::uint16_t v) { return from_float16_bits(v); });
  convert_all<std::int32_t, float>(from, to, n, [](std::int32_t value) { return static_cast<float>(value); });
}

}  // namespace cohort::cpu
