// Element-type conversion and zeroing for the CPU backend: the scalar rules of core/dtype.hpp over a tensor,
// split across the OpenMP thread budget when it is large. The rules are passed as lambdas, so that they are
// inlined into the loops: the bfloat16 ones are branch-free and vectorize. float16 goes through the
// processor's F16C conversions where it has them, which give the rules' bits for every float (their
// branches for subnormals keep the scalar loop from vectorizing).
#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {
namespace {

template <class From, class To, class Rule>
void convert_all(const void* from, void* to, std::int64_t n, Rule rule) {
  const auto* in = static_cast<const From*>(from);
  auto* out = static_cast<To*>(to);
#pragma omp parallel for simd if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) out[i] = rule(in[i]);
}

#if defined(__x86_64__)
// F16C's bit of CPUID leaf 1 (not every compiler's __builtin_cpu_supports names it), on a processor whose
// operating system keeps the AVX state.
bool processor_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void to_float16_f16c(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = to_float16_bits(in[i]);
}

__attribute__((target("avx,f16c"))) void from_float16_f16c(const std::uint16_t* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = from_float16_bits(in[i]);
}

// Runs `convert(in, out, count)` over blocks of the n elements, in parallel when there are many.
template <class From, class To, class Convert>
void in_blocks(const void* from, void* to, std::int64_t n, Convert convert) {
  constexpr std::int64_t kBlock = 4096;
  const auto* in = static_cast<const From*>(from);
  auto* out = static_cast<To*>(to);
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > kParallelThreshold)
  for (std::int64_t b = 0; b < blocks; ++b) convert(in + b * kBlock, out + b * kBlock, std::min(kBlock, n - b * kBlock));
}
#endif

}  // namespace

void CpuBackend::zero(const Tensor& x) {
  if (x.numel() > 0) std::memset(device_bytes(x), 0, x.bytes());
}

void CpuBackend::write_bits(const Tensor& destination, std::uint64_t bits) {
  static_assert(std::endian::native == std::endian::little, "the low bytes of `bits` come first");
  std::memcpy(device_bytes(destination), &bits, destination.bytes());
}

void CpuBackend::convert(const Tensor& source, const Tensor& destination) {
  const std::int64_t n = source.numel();
  const void* from = device_bytes(source);
  void* to = device_bytes(destination);
  const DType from_type = source.dtype();
  if (from_type == DType::Float32 && destination.dtype() == DType::BFloat16)
    return convert_all<float, std::uint16_t>(from, to, n, [](float v) { return to_bfloat16_bits(v); });
#if defined(__x86_64__)
  if (processor_has_f16c() && from_type == DType::Float32 && destination.dtype() == DType::Float16)
    return in_blocks<float, std::uint16_t>(from, to, n, to_float16_f16c);
  if (processor_has_f16c() && from_type == DType::Float16 && destination.dtype() == DType::Float32)
    return in_blocks<std::uint16_t, float>(from, to, n, from_float16_f16c);
#endif
  if (from_type == DType::Float32 && destination.dtype() == DType::Float16)
    return convert_all<float, std::uint16_t>(from, to, n, [](float v) { return to_float16_bits(v); });
  if (from_type == DType::BFloat16 && destination.dtype() == DType::Float32)
    return convert_all<std::uint16_t, float>(from, to, n, [](std::uint16_t v) { return from_bfloat16_bits(v); });
  if (from_type == DType::Float16 && destination.dtype() == DType::Float32)
    return convert_all<std::uint16_t, float>(from, to, n, [](std::uint16_t v) { return from_float16_bits(v); });
  convert_all<std::int32_t, float>(from, to, n, [](std::int32_t value) { return static_cast<float>(value); });
}

}  // namespace cohort::cpu
