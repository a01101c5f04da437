#pragma once
// cereal serialization of tensors for the library's binary archives (optimizer state, checkpoints):
// the extents, the element type's code (DType), then the raw values. Private to src/: public headers stay
// free of cereal.
// Tensors of any device are saved through the host and always load onto the CPU, so an archive moves
// between devices unchanged.
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "cohort/core/check.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort {

template <class Archive>
void save(Archive& archive, const Tensor& tensor) {
  archive(tensor.shape().dims(), static_cast<std::uint8_t>(tensor.dtype()));
  const Tensor host = tensor.to(Device::CPU);
  archive(cereal::binary_data(host.host_bytes().data(), host.bytes()));
}

template <class Archive>
void load(Archive& archive, Tensor& tensor) {
  std::vector<std::int64_t> dims;
  archive(dims);
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;
  std::int64_t count = 1;
  for (auto d : dims) {
    // Divided, not multiplied: the extents come from the file and may be anything.
    COHORT_CHECK_AS(DataError, d >= 0 && d < kMaxElements && (d == 0 || count < kMaxElements / d),
                    "archived tensor has implausible extents");
    count *= d;
  }
  std::uint8_t type_code = 0;
  archive(type_code);
  const std::optional<DType> dtype = dtype_from_code(type_code);
  COHORT_CHECK_AS(DataError, dtype.has_value(), "archived tensor has element type code {}, which names no type", type_code);
  if constexpr (requires { archive.remaining(); })
    COHORT_CHECK_AS(DataError, static_cast<std::uint64_t>(count) * element_size(*dtype) <= archive.remaining(),
                    "archived {} tensor of {} elements is longer than the {} bytes left", dtype_name(*dtype), count,
                    archive.remaining());
  tensor = Tensor(Shape(std::move(dims)), *dtype);
  archive(cereal::binary_data(tensor.host_bytes().data(), tensor.bytes()));
}

}  // namespace cohort
