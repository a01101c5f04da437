// expand_images on the CPU: a sample per iteration, spread over the OpenMP threads.
#include <algorithm>
#include <cstdint>

#include "cpu_backend.hpp"
#include "tensor/backend_access.hpp"
#include "tensor/image_expansion.hpp"

namespace cohort::cpu {

void CpuBackend::expand_images(const Tensor& images, const Tensor& indices, const Tensor& draws, const Tensor& mean,
                               const Tensor& stddev, const Tensor& out) {
  const ImageExpansion expansion{images.dim(1), images.dim(2), images.dim(3)};
  const std::int64_t samples = out.dim(0), sample_size = expansion.height * expansion.width * expansion.channels;
  const auto* pixels = static_cast<const std::uint8_t*>(device_bytes(images));
  const auto* index = indices.defined() ? static_cast<const std::int32_t*>(device_bytes(indices)) : nullptr;
  const auto* drawn = static_cast<const std::int32_t*>(device_bytes(draws));
  const float* means = device_data(mean);
  const float* deviations = device_data(stddev);
  float* values = device_data(out);
  const std::int64_t stored = images.dim(0);
#pragma omp parallel for if (samples * sample_size > (1 << 16))
  for (std::int64_t n = 0; n < samples; ++n) {
    const std::int64_t source = index != nullptr ? index[n] : n;
    float* written = values + n * sample_size;
    if (source < 0 || source >= stored) {  // as a GPU does (ops.cpp refuses them where it can read the indices)
      std::fill_n(written, sample_size, 0.0f);
      continue;
    }
    const std::uint8_t* sample = pixels + source * sample_size;
    const std::int32_t* draw = drawn + n * 3;
    for (std::int64_t y = 0; y < expansion.height; ++y)
      for (std::int64_t x = 0; x < expansion.width; ++x)
        for (std::int64_t c = 0; c < expansion.channels; ++c)
          *written++ = expansion(sample, y, x, c, draw[0], draw[1], draw[2], means[c], deviations[c]);
  }
}

}  // namespace cohort::cpu
