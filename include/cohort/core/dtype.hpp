#pragma once
// Element types: one enum for tensors, messages on the wire and files. float32 is what every op computes
// in; bfloat16 and float16 are the low types of mixed precision; int32 holds class labels; uint8 holds
// images as they are stored, a quarter of float32's bytes to copy to a device.
//
//   DType type = parse_dtype("bfloat16").value();    // "float32", "bfloat16", "float16", "int32", "uint8"
//   std::uint16_t bits = to_bfloat16_bits(1.5f);     // round to nearest even; NaN stays NaN
//   float back = from_bfloat16_bits(bits);           // exact

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cohort {

// The values are part of file and wire formats: never renumber them.
enum class DType : std::uint8_t { Float32 = 0, BFloat16 = 1, Float16 = 2, Int32 = 3, UInt8 = 4 };

constexpr std::string_view dtype_name(DType type) {
  switch (type) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
  }
  return "unknown";
}

constexpr std::size_t element_size(DType type) {
  if (type == DType::UInt8) return 1;
  return type == DType::BFloat16 || type == DType::Float16 ? 2 : 4;
}

constexpr bool is_floating(DType type) { return type != DType::Int32 && type != DType::UInt8; }

// "float32", "bfloat16", "float16", "int32" or "uint8"; nullopt for anything else.
constexpr std::optional<DType> parse_dtype(std::string_view name) {
  for (DType type : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::UInt8})
    if (dtype_name(type) == name) return type;
  return std::nullopt;
}

// A byte from a file or a message: nullopt unless it names an element type.
constexpr std::optional<DType> dtype_from_code(std::uint8_t code) {
  if (code > static_cast<std::uint8_t>(DType::UInt8)) return std::nullopt;
  return static_cast<DType>(code);
}

// Host storage of the 16-bit types: the bits, so that nothing converts them implicitly.
struct BFloat16 {
  std::uint16_t bits;
};
struct Float16 {
  std::uint16_t bits;
};

template <class T>
inline constexpr std::optional<DType> dtype_of_v = std::nullopt;
template <>
inline constexpr std::optional<DType> dtype_of_v<float> = DType::Float32;
template <>
inline constexpr std::optional<DType> dtype_of_v<BFloat16> = DType::BFloat16;
template <>
inline constexpr std::optional<DType> dtype_of_v<Float16> = DType::Float16;
template <>
inline constexpr std::optional<DType> dtype_of_v<std::int32_t> = DType::Int32;
template <>
inline constexpr std::optional<DType> dtype_of_v<std::uint8_t> = DType::UInt8;

// An element type a tensor can hold on the host: float, BFloat16, Float16, std::int32_t or std::uint8_t.
template <class T>
concept Element = dtype_of_v<T>.has_value();

template <Element T>
inline constexpr DType dtype_of = *dtype_of_v<T>;

// ---- conversions, in integer arithmetic so that no floating-point mode (flush-to-zero) changes them.
// float -> low type rounds to nearest, ties to even; infinities stay infinite, NaN stays NaN (quieted,
// sign and leading payload bits kept); subnormals of the low type are produced, not flushed.

constexpr std::uint16_t to_bfloat16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

constexpr float from_bfloat16_bits(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

constexpr std::uint16_t to_float16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to infinity
  if (magnitude < 0x38800000u) {                        // below 2^-14: a float16 subnormal or zero
    if (magnitude <= 0x33000000u) return sign;          // at most half the smallest subnormal (2^-25)
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (magnitude >> 23);
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u) != 0)) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  const std::uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
  std::uint32_t result = rebiased >> 13;
  const std::uint32_t rest = rebiased & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u) != 0)) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

constexpr float from_float16_bits(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t{bits & 0x8000u} << 16;
  std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) {  // infinity, or NaN (quieted, as the processor's conversion does)
    const std::uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    exponent = 113;  // a subnormal: normalize its mantissa
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return std::bit_cast<float>(sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The float32 value nearest to `value` that the type can hold: what a round trip through it leaves.
constexpr float round_to(DType type, float value) {
  switch (type) {
    case DType::BFloat16: return from_bfloat16_bits(to_bfloat16_bits(value));
    case DType::Float16: return from_float16_bits(to_float16_bits(value));
    case DType::Float32:
    case DType::Int32:
    case DType::UInt8: break;
  }
  return value;
}

// Half the distance between 1 and the next value of the type: the bound on a rounding's relative error.
constexpr double unit_roundoff(DType type) {
  switch (type) {
    case DType::BFloat16: return 1.0 / 256;   // 8 significant bits
    case DType::Float16: return 1.0 / 2048;   // 11
    case DType::Float32: return 1.0 / 16777216;  // 24
    case DType::Int32:
    case DType::UInt8: break;
  }
  return 0.0;
}

}  // namespace cohort
