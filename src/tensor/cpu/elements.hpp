#pragma once
// A CPU kernel's view of an operand stored as float32 or as bfloat16 (its bits): reads widen to float,
// writes round to nearest even once. A kernel written against it computes in float32 whatever its operands
// store, and gives the bits that float32 stand-ins would (the same arithmetic, rounded once on the way out).
//
//   with_stored(x.dtype(), [&](auto stored) {
//     using T = decltype(stored);
//     const Elements<T> in(x), out(y);
//     for (std::int64_t i = 0; i < n; ++i) out.set(i, 2 * in[i]);
//   });
#include <cstdint>

#include "cohort/core/dtype.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu {

template <class Stored>
class Elements;

template <>
class Elements<float> {
 public:
  explicit Elements(const Tensor& t) : values_(device_data(t)) {}
  float operator[](std::int64_t i) const { return values_[i]; }
  void set(std::int64_t i, float value) const { values_[i] = value; }

 private:
  float* values_;
};

template <>
class Elements<std::uint16_t> {
 public:
  explicit Elements(const Tensor& t) : bits_(static_cast<std::uint16_t*>(device_bytes(t))) {}
  float operator[](std::int64_t i) const { return from_bfloat16_bits(bits_[i]); }
  void set(std::int64_t i, float value) const { bits_[i] = to_bfloat16_bits(value); }

 private:
  std::uint16_t* bits_;
};

// A tensor's elements as the stored type: float, or the bfloat16 bits.
template <class Stored>
Stored* device_elements(const Tensor& t) {
  return static_cast<Stored*>(device_bytes(t));
}

// Calls body(float{}) for float32 operands, body(std::uint16_t{}) for bfloat16 ones.
template <class Body>
decltype(auto) with_stored(DType type, Body&& body) {
  if (type == DType::BFloat16) return body(std::uint16_t{});
  return body(float{});
}

// Calls body(begin, end) on consecutive blocks of [0, n), spread over the threads when n is large. A loop
// over a block with `#pragma omp simd` vectorizes on 16-bit operands, where the same loop under
// `omp parallel for simd` falls back to scalar code behind GCC's runtime aliasing check.
template <class Body>
void in_blocks(std::int64_t n, Body&& body) {
  constexpr std::int64_t kBlock = 1 << 14;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (blocks > 2)
  for (std::int64_t b = 0; b < blocks; ++b) body(b * kBlock, b * kBlock + kBlock < n ? b * kBlock + kBlock : n);
}

}  // namespace cohort::cpu
