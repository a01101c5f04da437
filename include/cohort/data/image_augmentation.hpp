#pragma once
// ImageAugmentation: the usual augmentation and normalization of 8-bit images as a description rather than
// code, so that the device that trains can apply it. A loader given one (LoaderOptions::byte_images) hands
// out each batch's images as the data set stores them (uint8, a quarter of float32's bytes to copy) with
// each sample's random draws; ImageExpander turns them into the float32 images on the batch's device. The
// values equal, bit for bit, those of the host transforms that transforms_of() returns. Where a data set fits
// on the device, stored_images() puts all of it there once, and batches need carry only sample indices.
//
//   const data::ImageAugmentation augmentation{.crop_padding = 4, .flip_horizontal = true,
//                                              .mean = stats.mean, .stddev = stats.stddev};
//   loader_options.byte_images = augmentation;                 // batches of uint8 images and draws
//   const data::ImageExpander expand(augmentation, 3, Device::CUDA);
//   Tensor images = expand(batch.images, {}, batch.draws);     // float32 (N, H, W, C), batch on the GPU

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cohort/data/transforms.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::data {

struct ImageAugmentation {
  int crop_padding = 0;             // as random_crop(crop_padding); 0: no crop
  bool flip_horizontal = false;     // as random_flip_horizontal()
  std::vector<float> mean, stddev;  // as normalize(mean, stddev); empty: values stay in [0, 1]
};

// The host transforms that compute the same values: {random_crop, random_flip_horizontal, normalize}, each
// where the augmentation asks for it. InvalidArgument for a negative padding or a malformed normalization.
std::vector<Transform> transforms_of(const ImageAugmentation& augmentation);

// What it does, for logs: "cropped at random within 4 pixels of padding, flipped at random, normalized".
std::string describe(const ImageAugmentation& augmentation);

// One sample's draws (dy, dx, flip) from its random stream, as the transforms of transforms_of() take them.
std::array<std::int32_t, 3> draw(const ImageAugmentation& augmentation, std::mt19937_64& rng);

// Every sample of an 8-bit data set (Dataset::stores_bytes()) as one uint8 tensor (S, ...sample shape) on
// `device`, for batches of sample indices (LoaderOptions::sample_indices_only).
Tensor stored_images(const Dataset& dataset, Device device);

// Expands a byte batch on `device` into float32 images: images uint8 (N, H, W, C) with indices undefined, or
// the whole data set's (stored_images()) with each sample's index (int32 (N)); draws int32 (N, 3).
class ImageExpander {
 public:
  ImageExpander(const ImageAugmentation& augmentation, std::int64_t channels, Device device);
  Tensor operator()(const Tensor& images, const Tensor& indices, const Tensor& draws) const;

 private:
  Tensor mean_, stddev_;
};

}  // namespace cohort::data
