// Element types: the conversion rules against an independent reference (the nearest of every value the type
// holds, ties to the even one), tensors of each type, and ops that refuse a type by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "cohort/core/dtype.hpp"
#include "cohort/core/error.hpp"
#include "cohort/tensor/ops.hpp"
#include "core/archive_bytes.hpp"
#include "tensor/tensor_archive.hpp"

using namespace cohort;

namespace {

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }

std::uint16_t narrow(DType type, float value) {
  return type == DType::BFloat16 ? to_bfloat16_bits(value) : to_float16_bits(value);
}
float widen(DType type, std::uint16_t bits) {
  return type == DType::BFloat16 ? from_bfloat16_bits(bits) : from_float16_bits(bits);
}

// Every finite non-negative value of a 16-bit type with its bits, ascending.
std::vector<std::pair<double, std::uint16_t>> finite_values(DType type) {
  std::vector<std::pair<double, std::uint16_t>> values;
  for (std::uint32_t bits = 0; bits < 0x8000; ++bits) {
    const float value = widen(type, static_cast<std::uint16_t>(bits));
    if (std::isfinite(value)) values.emplace_back(value, static_cast<std::uint16_t>(bits));
  }
  std::sort(values.begin(), values.end());
  return values;
}

// The bits round-to-nearest-even gives `value` (finite), from the type's list of values: the nearer
// neighbour, the one with an even last bit on a tie, infinity beyond the largest value plus half a step.
std::uint16_t reference(const std::vector<std::pair<double, std::uint16_t>>& values, float value, std::uint16_t infinity) {
  const double magnitude = std::abs(static_cast<double>(value));
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const auto above = std::lower_bound(values.begin(), values.end(), std::pair{magnitude, std::uint16_t{0}});
  if (above != values.end() && above->first == magnitude) return sign | above->second;
  const auto& largest = values.back();
  const double step = largest.first - values[values.size() - 2].first;
  if (above == values.end()) {
    const double limit = largest.first + step / 2;
    return sign | (magnitude < limit ? largest.second : infinity);  // at the limit itself: the even one is infinity
  }
  const auto below = above - 1;
  const double to_below = magnitude - below->first, to_above = above->first - magnitude;
  if (to_below < to_above) return sign | below->second;
  if (to_above < to_below) return sign | above->second;
  return sign | ((below->second & 1) == 0 ? below->second : above->second);
}

}  // namespace

TEST_CASE("element types have names, sizes and codes", "[tensor][dtype]") {
  for (DType type : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::UInt8}) {
    CHECK(parse_dtype(dtype_name(type)) == type);
    CHECK(dtype_from_code(static_cast<std::uint8_t>(type)) == type);
  }
  CHECK(element_size(DType::BFloat16) == 2);
  CHECK(element_size(DType::Float16) == 2);
  CHECK(element_size(DType::Float32) == 4);
  CHECK(element_size(DType::Int32) == 4);
  CHECK(element_size(DType::UInt8) == 1);
  CHECK_FALSE(is_floating(DType::UInt8));
  CHECK(Tensor({2, 3}, DType::UInt8).bytes() == 6);
  CHECK_FALSE(parse_dtype("bf16").has_value());
  CHECK_FALSE(dtype_from_code(5).has_value());
}

TEST_CASE("conversion to bfloat16 and float16 rounds to the nearest value, ties to even", "[tensor][dtype]") {
  for (DType type : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(type));
    const auto values = finite_values(type);
    const std::uint16_t infinity = narrow(type, std::numeric_limits<float>::infinity());
    // Every value of the type survives a round trip through float32, sign included.
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const float wide = widen(type, static_cast<std::uint16_t>(bits));
      if (std::isnan(wide)) continue;
      REQUIRE(narrow(type, wide) == bits);
    }
    // Ties and near-ties between each pair of neighbours, and random floats of every exponent.
    std::vector<float> probes;
    for (std::size_t i = 0; i + 1 < values.size(); i += 7) {
      const double low = values[i].first, high = values[i + 1].first, middle = (low + high) / 2;
      for (float probe : {static_cast<float>(middle), std::nextafter(static_cast<float>(middle), 0.0f),
                          std::nextafter(static_cast<float>(middle), 1e30f)})
        probes.push_back(probe);
    }
    std::mt19937 random(7);
    for (int i = 0; i < 200000; ++i) probes.push_back(from_bits(static_cast<std::uint32_t>(random()) & 0x7f7fffffu));
    for (float probe : probes) {
      INFO("probe " << probe << " bits " << std::hex << bits_of(probe));
      REQUIRE(narrow(type, probe) == reference(values, probe, infinity));
      REQUIRE(narrow(type, -probe) == reference(values, -probe, infinity));
    }
  }
  // Worked cases: 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7, and goes to the even 1;
  // 1 + 3 * 2^-8 goes up to the even 1 + 2^-6.
  CHECK(from_bfloat16_bits(to_bfloat16_bits(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(from_bfloat16_bits(to_bfloat16_bits(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(from_float16_bits(to_float16_bits(65519.0f)) == 65504.0f);
  CHECK(std::isinf(from_float16_bits(to_float16_bits(65520.0f))));
  CHECK(std::isinf(from_bfloat16_bits(to_bfloat16_bits(std::numeric_limits<float>::max()))));
}

TEST_CASE("conversions keep infinities, NaN and subnormals", "[tensor][dtype]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType type : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(type));
    CHECK(widen(type, narrow(type, inf)) == inf);
    CHECK(widen(type, narrow(type, -inf)) == -inf);
    // Quiet and signalling NaNs of either sign stay NaN of that sign, never infinity.
    for (std::uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00000u}) {
      const float back = widen(type, narrow(type, from_bits(bits)));
      CHECK(std::isnan(back));
      CHECK(std::signbit(back) == ((bits >> 31) != 0));
    }
    CHECK(std::signbit(widen(type, narrow(type, -0.0f))));
  }
  // float16 subnormals: 2^-24 is the smallest, 2^-25 ties to zero, 3 * 2^-25 ties up to 2 * 2^-24.
  CHECK(to_float16_bits(0x1p-24f) == 0x0001);
  CHECK(to_float16_bits(0x1p-25f) == 0x0000);
  CHECK(to_float16_bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(to_float16_bits(3 * 0x1p-25f) == 0x0002);
  CHECK(to_float16_bits(-0x1p-24f) == 0x8001);
  CHECK(from_float16_bits(0x03ff) == 1023 * 0x1p-24f);
  // bfloat16 keeps float32's subnormal range: nothing is flushed to zero.
  CHECK(to_bfloat16_bits(from_bits(0x00010000u)) == 0x0001);
  CHECK(from_bfloat16_bits(0x0001) == from_bits(0x00010000u));
  CHECK(to_bfloat16_bits(from_bits(0x00000001u)) == 0x0000);
  CHECK(to_bfloat16_bits(from_bits(0x80008000u)) == 0x8000);  // a tie: to the even zero, sign kept
  CHECK(to_bfloat16_bits(from_bits(0x00018000u)) == 0x0002);  // a tie: up to the even 2
}

TEST_CASE("tensor conversions give the scalar rules' bits, whatever instructions carry them", "[tensor][dtype]") {
  // Random bit patterns of every class (NaN, infinity, subnormal, normal), over a size that is no multiple of
  // a vector and large enough to be split across threads.
  std::mt19937 random(11);
  std::vector<float> floats(100003);
  for (float& f : floats) f = from_bits(static_cast<std::uint32_t>(random()));
  for (std::uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x00000001u, 0x80000002u, 0x477ff000u, 0x33000000u})
    floats.push_back(from_bits(bits));
  const Tensor wide = Tensor::from_values({static_cast<std::int64_t>(floats.size())}, floats);
  for (DType type : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(type));
    const Tensor low = wide.to(type);
    const auto* bits = reinterpret_cast<const std::uint16_t*>(low.host_bytes().data());
    const std::vector<float> back = low.to_vector();
    for (std::size_t i = 0; i < floats.size(); ++i) {
      INFO("float bits " << std::hex << bits_of(floats[i]));
      REQUIRE(bits[i] == narrow(type, floats[i]));
      const float expected = widen(type, bits[i]);
      if (std::isnan(expected)) REQUIRE(std::isnan(back[i]));
      else REQUIRE(bits_of(back[i]) == bits_of(expected));
    }
  }
}

TEST_CASE("tensors hold each element type, sized by it, and read only as it", "[tensor][dtype]") {
  Tensor wide = Tensor::from_values({2, 3}, std::vector<float>{1.0f, -2.5f, 3.00390625f, 1e-3f, 65519.0f, 7.0f});
  CHECK(wide.dtype() == DType::Float32);
  const Tensor low = wide.to(DType::BFloat16);
  CHECK(low.dtype() == DType::BFloat16);
  CHECK(low.bytes() == 12);
  CHECK(low.shape() == wide.shape());
  CHECK(low.data<BFloat16>()[1].bits == to_bfloat16_bits(-2.5f));
  CHECK(wide.to(DType::Float32).shares_storage_with(wide));
  // The round trip rounds each value as the scalar rule does; to_vector() widens.
  const std::vector<float> back = low.to_vector();
  for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == round_to(DType::BFloat16, wide.values()[i]));
  const Tensor half = low.to(DType::Float16);  // through float32: bfloat16 values float16 can hold stay exact
  CHECK(half.to_vector()[0] == 1.0f);
  CHECK(std::isinf(half.to_vector()[4]));  // bfloat16 rounded 65519 up to 65536, which float16 cannot hold
  // A slice of a 16-bit tensor starts at its own row.
  CHECK(low.slice(1, 2).data<BFloat16>()[0].bits == to_bfloat16_bits(1e-3f));
  CHECK(low.slice(1, 2).to_vector()[0] == round_to(DType::BFloat16, 1e-3f));
  // Host access in another type is refused by name, never a reinterpretation of the bytes.
  CHECK_THROWS_WITH(low.data(), Catch::Contains("as float32 to a bfloat16 tensor of shape (2, 3)"));
  CHECK_THROWS_AS(low.data<Float16>(), InvalidArgument);
  CHECK_THROWS_WITH(wide.data<std::int32_t>(), Catch::Contains("int32") && Catch::Contains("float32"));
  const Tensor labels = Tensor::from_values({3}, std::vector<std::int32_t>{4, 0, 9});
  CHECK(labels.dtype() == DType::Int32);
  CHECK(labels.data<std::int32_t>()[2] == 9);
  CHECK(labels.to_vector() == std::vector<float>{4, 0, 9});
  CHECK(Tensor({4}, DType::Float16).to_vector() == std::vector<float>(4, 0.0f));
}

TEST_CASE("ops refuse operands of types they do not take, naming the op, the types and the shapes", "[tensor][dtype]") {
  const Tensor x = Tensor::full({2, 3}, 1.0f);
  const Tensor low = x.to(DType::BFloat16);
  // Float32 and one 16-bit type mix (16-bit activations, float32 parameters); two 16-bit types or integers do not.
  CHECK_THROWS_WITH(ops::axpy(1.0f, low, x.to(DType::Float16)),
                    Catch::Contains("axpy: takes float32 and at most one 16-bit type of operands") &&
                        Catch::Contains("bfloat16 (2, 3) on cpu, float16 (2, 3) on cpu"));
  const Tensor y({2, 4});
  CHECK_THROWS_WITH(ops::matmul(x, false, Tensor({3, 4}, DType::Int32), false, y),
                    Catch::Contains("matmul") && Catch::Contains("int32 (3, 4)"));
  CHECK_THROWS_WITH(ops::copy(low, x), Catch::Contains("copy: takes same-typed operands") && Catch::Contains("bfloat16 (2, 3)"));
  CHECK_THROWS_WITH(ops::convert(x, Tensor({3, 2}, DType::BFloat16)), Catch::Contains("convert: shapes differ"));
  CHECK_THROWS_WITH(ops::convert(x, Tensor({2, 3}, DType::Int32)), Catch::Contains("float32 (2, 3)") && Catch::Contains("int32 (2, 3)"));
  // A copy between tensors of one 16-bit type is fine.
  const Tensor copied({2, 3}, DType::BFloat16);
  ops::copy(low, copied);
  CHECK(copied.to_vector() == low.to_vector());
}

TEST_CASE("class labels may be int32, and mean what the same float32 labels mean", "[tensor][dtype]") {
  const Tensor logits = Tensor::from_values({3, 4}, std::vector<float>{0.1f, 2.0f, -1.0f, 0.5f, 1.5f, 0.2f, 0.3f, 0.0f,
                                                                         -0.4f, 0.1f, 0.9f, 3.0f});
  const Tensor float_labels = Tensor::from_values({3}, std::vector<float>{1, 2, 3});
  const Tensor int_labels = Tensor::from_values({3}, std::vector<std::int32_t>{1, 2, 3});
  const Tensor d_float({3, 4}), d_int({3, 4});
  CHECK(ops::softmax_cross_entropy(logits, int_labels, d_int) == ops::softmax_cross_entropy(logits, float_labels, d_float));
  CHECK(d_int.to_vector() == d_float.to_vector());
  CHECK(ops::count_correct(logits, int_labels) == 2);
  CHECK(ops::count_correct(logits, int_labels) == ops::count_correct(logits, float_labels));
  const Tensor one_hot_ints({3, 4}, DType::Int32);
  CHECK_THROWS_WITH(ops::count_correct(logits, one_hot_ints), Catch::Contains("int32 class indices"));
  CHECK_THROWS_WITH(ops::softmax_cross_entropy(Tensor({3, 4}, DType::Int32), int_labels, Tensor()),
                    Catch::Contains("softmax_cross_entropy") && Catch::Contains("int32 (3, 4)"));
}

TEST_CASE("archived tensors keep their element type and bits, and an unknown type code is refused", "[tensor][dtype]") {
  const Tensor values = Tensor::from_values({5}, std::vector<float>{1.0f, -0.0f, 3.3f, 1e-40f, -7.0f});
  for (DType type : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(type));
    const Tensor original = values.to(type);
    const auto loaded = from_archive_bytes<DataError, Tensor>(to_archive_bytes(original), "tensor");
    CHECK(loaded.dtype() == type);
    CHECK(loaded.shape() == original.shape());
    const auto a = original.host_bytes(), b = loaded.host_bytes();
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  }
  std::string bytes = to_archive_bytes(values.to(DType::BFloat16));
  // The extents (a count, then one extent) come first, then the type's code.
  const std::size_t code_at = bytes.size() - values.numel() * 2 - 1;
  REQUIRE(static_cast<std::uint8_t>(bytes[code_at]) == static_cast<std::uint8_t>(DType::BFloat16));
  bytes[code_at] = 9;
  CHECK_THROWS_WITH((from_archive_bytes<DataError, Tensor>(bytes, "tensor")), Catch::Contains("element type code 9"));
}
