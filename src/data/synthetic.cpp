#include "cohort/data/synthetic.hpp"

#include <algorithm>
#include <random>

#include "cohort/core/check.hpp"

namespace cohort::data {

ImageDataset make_synthetic(const SyntheticOptions& options) {
  COHORT_CHECK(options.samples >= 0 && options.classes > 0 && options.classes <= 256,
               "synthetic set needs samples >= 0 and 1-256 classes");
  const std::int64_t n = options.sample_shape.numel();
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::vector<int>> prototypes(static_cast<std::size_t>(options.classes), std::vector<int>(static_cast<std::size_t>(n)));
  for (auto& prototype : prototypes)
    for (int& v : prototype) v = byte(rng);
  std::uniform_int_distribution<int> noise(-options.noise, options.noise);
  std::uniform_int_distribution<int> label(0, options.classes - 1);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(options.samples * n));
  std::vector<std::uint8_t> labels(static_cast<std::size_t>(options.samples));
  for (std::int64_t s = 0; s < options.samples; ++s) {
    const int c = label(rng);
    labels[static_cast<std::size_t>(s)] = static_cast<std::uint8_t>(c);
    for (std::int64_t i = 0; i < n; ++i)
      pixels[static_cast<std::size_t>(s * n + i)] =
          static_cast<std::uint8_t>(std::clamp(prototypes[static_cast<std::size_t>(c)][static_cast<std::size_t>(i)] + noise(rng), 0, 255));
  }
  return ImageDataset(options.sample_shape, options.classes, std::move(pixels), std::move(labels),
                      fmt::format("synthetic {} x {}, {} classes", options.samples, options.sample_shape, options.classes));
}

}  // namespace cohort::data
