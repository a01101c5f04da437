#pragma once
// Shape: the extents of a tensor, outermost first (NHWC for images, like Keras' channels_last).
//
//   Shape s{128, 32, 32, 3};   s.numel() == 393216;   fmt::format("{}", s) == "(128, 32, 32, 3)"

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace cohort {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int axis) const { return dims_.at(static_cast<std::size_t>(axis)); }
  std::int64_t& operator[](int axis) { return dims_.at(static_cast<std::size_t>(axis)); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  const std::vector<std::int64_t>& dims() const { return dims_; }

  // The same shape with `batch` prepended: the shape of a batch of samples of this shape.
  Shape batched(std::int64_t batch) const {
    std::vector<std::int64_t> dims{batch};
    dims.insert(dims.end(), dims_.begin(), dims_.end());
    return Shape(std::move(dims));
  }
  // The shape without its first axis: the shape of one sample of a batch.
  Shape sample() const { return Shape(std::vector<std::int64_t>(dims_.begin() + (dims_.empty() ? 0 : 1), dims_.end())); }

  std::string to_string() const;

  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<std::int64_t> dims_;
};

}  // namespace cohort

template <>
struct fmt::formatter<cohort::Shape> : fmt::formatter<std::string> {
  template <typename FormatContext>
  auto format(const cohort::Shape& shape, FormatContext& ctx) const {
    return fmt::formatter<std::string>::format(shape.to_string(), ctx);
  }
};
