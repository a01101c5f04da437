#include "cohort/data/image_augmentation.hpp"

#include <fmt/ranges.h>

#include "cohort/core/check.hpp"
#include "cohort/tensor/ops.hpp"
#include "data/random_draws.hpp"

namespace cohort::data {

std::vector<Transform> transforms_of(const ImageAugmentation& augmentation) {
  std::vector<Transform> transforms;
  if (augmentation.crop_padding != 0) transforms.push_back(random_crop(augmentation.crop_padding));
  if (augmentation.flip_horizontal) transforms.push_back(random_flip_horizontal());
  if (!augmentation.mean.empty() || !augmentation.stddev.empty())
    transforms.push_back(normalize(augmentation.mean, augmentation.stddev));
  return transforms;
}

std::string describe(const ImageAugmentation& augmentation) {
  std::vector<std::string> steps;
  if (augmentation.crop_padding != 0)
    steps.push_back(fmt::format("cropped at random within {} pixels of padding", augmentation.crop_padding));
  if (augmentation.flip_horizontal) steps.push_back("flipped at random");
  steps.push_back(augmentation.mean.empty() ? "scaled to [0, 1]" : "normalized");
  return fmt::format("{}", fmt::join(steps, ", "));
}

std::array<std::int32_t, 3> draw(const ImageAugmentation& augmentation, std::mt19937_64& rng) {
  COHORT_CHECK(augmentation.crop_padding >= 0, "random_crop padding must be >= 0, got {}", augmentation.crop_padding);
  std::array<std::int32_t, 3> drawn{0, 0, 0};
  if (augmentation.crop_padding != 0) {
    const auto [dy, dx] = draw_crop_offset(augmentation.crop_padding, rng);
    drawn[0] = dy;
    drawn[1] = dx;
  }
  if (augmentation.flip_horizontal) drawn[2] = draw_flip(rng) ? 1 : 0;
  return drawn;
}

ImageExpander::ImageExpander(const ImageAugmentation& augmentation, std::int64_t channels, Device device) {
  transforms_of(augmentation);  // the same checks as the host's transforms
  const bool normalizes = !augmentation.mean.empty();
  COHORT_CHECK(!normalizes || static_cast<std::int64_t>(augmentation.mean.size()) == channels,
               "the image augmentation normalizes {} channels, the images have {}", augmentation.mean.size(), channels);
  // Without a normalization, (v - 0) / 1 leaves each value as it is.
  const std::vector<float> mean = normalizes ? augmentation.mean : std::vector<float>(static_cast<std::size_t>(channels), 0.0f);
  const std::vector<float> stddev = normalizes ? augmentation.stddev : std::vector<float>(static_cast<std::size_t>(channels), 1.0f);
  mean_ = Tensor::from_values({channels}, mean).to(device);
  stddev_ = Tensor::from_values({channels}, stddev).to(device);
}

Tensor ImageExpander::operator()(const Tensor& images, const Tensor& indices, const Tensor& draws) const {
  Shape shape = images.shape();
  shape[0] = draws.dim(0);
  Tensor out = Tensor::uninitialized(std::move(shape), DType::Float32, images.device());
  ops::expand_images(images, indices, draws, mean_, stddev_, out);
  return out;
}

Tensor stored_images(const Dataset& dataset, Device device) {
  COHORT_CHECK(dataset.stores_bytes(), "'{}' does not give its samples as 8-bit values to keep on {}",
               dataset.description(), device_name(device));
  const std::int64_t sample_size = dataset.sample_shape().numel();
  const Tensor all = Tensor::uninitialized(dataset.sample_shape().batched(dataset.size()), DType::UInt8, Device::CPU);
  for (std::int64_t i = 0; i < dataset.size(); ++i) dataset.load_bytes(i, all.data<std::uint8_t>() + i * sample_size);
  try {
    return all.to(device);
  } catch (const DeviceError& error) {
    throw DeviceError(fmt::format("the training set's {} bytes of 8-bit images do not fit on {} ({}); train without "
                                  "resident images (--resident-images, FitOptions::resident_images)",
                                  all.bytes(), device_name(device), error.what()));
  }
}

}  // namespace cohort::data
