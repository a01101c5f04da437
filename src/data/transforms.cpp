#include "cohort/data/transforms.hpp"

#include <algorithm>
#include <cmath>

#include "cohort/core/check.hpp"
#include "data/random_draws.hpp"

namespace cohort::data {
namespace {

void check_image(const Shape& shape, const char* what) {
  COHORT_CHECK(shape.rank() == 3, "{} needs (height, width, channels) samples, got {}", what, shape);
}

}  // namespace

Transform random_crop(int padding) {
  COHORT_CHECK(padding >= 0, "random_crop padding must be >= 0, got {}", padding);
  return [padding](std::span<float> sample, const Shape& shape, std::mt19937_64& rng) {
    check_image(shape, "random_crop");
    const std::int64_t h = shape[0], w = shape[1], c = shape[2];
    const auto [dy, dx] = draw_crop_offset(padding, rng);
    const std::vector<float> source(sample.begin(), sample.end());
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x) {
        const std::int64_t sy = y + dy, sx = x + dx;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        for (std::int64_t k = 0; k < c; ++k)
          sample[static_cast<std::size_t>((y * w + x) * c + k)] = inside ? source[static_cast<std::size_t>((sy * w + sx) * c + k)] : 0.0f;
      }
  };
}

Transform random_flip_horizontal() {
  return [](std::span<float> sample, const Shape& shape, std::mt19937_64& rng) {
    check_image(shape, "random_flip_horizontal");
    if (!draw_flip(rng)) return;
    const std::int64_t h = shape[0], w = shape[1], c = shape[2];
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w / 2; ++x)
        for (std::int64_t k = 0; k < c; ++k)
          std::swap(sample[static_cast<std::size_t>((y * w + x) * c + k)], sample[static_cast<std::size_t>((y * w + (w - 1 - x)) * c + k)]);
  };
}

Transform normalize(std::vector<float> mean, std::vector<float> stddev) {
  COHORT_CHECK(mean.size() == stddev.size() && !mean.empty(),
               "normalize needs one mean and one stddev per channel, got {} means and {} standard deviations", mean.size(),
               stddev.size());
  for (float s : stddev) COHORT_CHECK(s > 0, "normalize: standard deviations must be positive, got {}", s);
  return [mean = std::move(mean), stddev = std::move(stddev)](std::span<float> sample, const Shape& shape, std::mt19937_64&) {
    const std::size_t c = mean.size();
    COHORT_CHECK(shape.rank() >= 1 && static_cast<std::size_t>(shape[shape.rank() - 1]) == c,
                 "normalize has {} channels, the sample shape is {}", c, shape);
    for (std::size_t i = 0; i < sample.size(); ++i) sample[i] = (sample[i] - mean[i % c]) / stddev[i % c];
  };
}

ChannelStatistics channel_statistics(const Dataset& dataset, std::int64_t max_samples) {
  const Shape shape = dataset.sample_shape();
  const auto c = static_cast<std::size_t>(shape[shape.rank() - 1]);
  const std::int64_t count = std::min(dataset.size(), std::max<std::int64_t>(max_samples, 1));
  COHORT_CHECK(count > 0, "channel_statistics of an empty data set");
  std::vector<double> sum(c, 0.0), squares(c, 0.0);
  std::vector<float> sample(static_cast<std::size_t>(shape.numel()));
  for (std::int64_t i = 0; i < count; ++i) {
    dataset.load(i * dataset.size() / count, sample.data());
    for (std::size_t j = 0; j < sample.size(); ++j) {
      sum[j % c] += sample[j];
      squares[j % c] += static_cast<double>(sample[j]) * sample[j];
    }
  }
  const double values_per_channel = static_cast<double>(count) * static_cast<double>(sample.size() / c);
  ChannelStatistics stats;
  for (std::size_t k = 0; k < c; ++k) {
    const double m = sum[k] / values_per_channel;
    stats.mean.push_back(static_cast<float>(m));
    stats.stddev.push_back(static_cast<float>(std::sqrt(std::max(squares[k] / values_per_channel - m * m, 1e-12))));
  }
  return stats;
}

}  // namespace cohort::data
