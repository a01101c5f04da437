#pragma once
// cereal serialization of tensors for the library's binary archives (optimizer state, checkpoints):
// the extents, then the raw float32 values. Private to src/: public headers stay free of cereal.
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
  archive(tensor.shape().dims());
  const Tensor host = tensor.to(Device::CPU);
  archive(cereal::binary_data(host.data(), host.bytes()));
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
  if constexpr (requires { archive.remaining(); })
    COHORT_CHECK_AS(DataError, static_cast<std::uint64_t>(count) * sizeof(float) <= archive.remaining(),
                    "archived tensor of {} elements is longer than the {} bytes left", count, archive.remaining());
  tensor = Tensor(Shape(std::move(dims)));
  archive(cereal::binary_data(tensor.data(), tensor.bytes()));
}

}  // namespace cohort
