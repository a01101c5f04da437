#include <catch2/catch.hpp>
#include <cstdint>

#include "cohort/core/error.hpp"
#include "cohort/tensor/tensor.hpp"

using cohort::Shape;
using cohort::Tensor;

TEST_CASE("tensors are zero-filled, 64-byte aligned and sized by their shape", "[tensor]") {
  for (std::int64_t n : {0, 1, 3, 17, 1000}) {
    Tensor t({n, 3});
    CHECK(t.numel() == n * 3);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % Tensor::kAlignment == 0);
    for (float v : t.values()) CHECK(v == 0.0f);
  }
}

TEST_CASE("view and slice share storage, clone copies", "[tensor]") {
  Tensor t = Tensor::from_values({2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5});
  Tensor flat = t.view({6});
  flat.data()[4] = 40;
  CHECK(t.data()[4] == 40);
  Tensor row = t.slice(1, 2);
  CHECK(row.shape() == Shape({1, 3}));
  CHECK(row.data()[0] == 3);
  CHECK(row.shares_storage_with(t));
  Tensor copy = t.clone();
  copy.data()[0] = 100;
  CHECK(t.data()[0] == 0);
  CHECK(fmt::format("{}", t.shape()) == "(2, 3)");
  CHECK(fmt::format("{}", Shape{7}) == "(7,)");
}

TEST_CASE("bad views, slices and extents are rejected", "[tensor]") {
  Tensor t({2, 3});
  CHECK_THROWS_AS(t.view({5}), cohort::InvalidArgument);
  CHECK_THROWS_AS(t.slice(1, 3), cohort::InvalidArgument);
  CHECK_THROWS_AS(Tensor({-1, 2}), cohort::InvalidArgument);
  CHECK_THROWS_AS(Tensor::from_values({2}, std::vector<float>{1, 2, 3}), cohort::InvalidArgument);
}

TEST_CASE("a device without a backend in this build is refused with DeviceError", "[tensor]") {
  CHECK_THROWS_AS(Tensor({4}, cohort::Device::CUDA), cohort::DeviceError);
  Tensor empty;
  CHECK_FALSE(empty.defined());
  CHECK_THROWS_AS(empty.data(), cohort::InvalidArgument);
}
