#pragma once
// expand_images, one output value at a time, for the CPU loops and the CUDA kernel alike: the float
// operations of the host's transforms (ImageDataset's scaling, random_crop, random_flip_horizontal,
// normalize) in their order and as separate roundings, so every device gives the host's bits. Its callers
// are built without contraction (the CUDA kernels, and tensor/cpu/images.cpp), which would fuse the
// scaling and the centring into one FMA.
#include <cstdint>

#include "tensor/host_device.hpp"

namespace cohort {

struct ImageExpansion {
  std::int64_t height, width, channels;

  // Output (y, x, c) of a sample drawn (dy, dx, flip): the cropped image is shifted by (dy, dx) with zeros
  // where it leaves the source, then mirrored. `pixels` is the sample's (H, W, C) bytes.
  COHORT_HOST_DEVICE float operator()(const std::uint8_t* pixels, std::int64_t y, std::int64_t x, std::int64_t c,
                                      std::int32_t dy, std::int32_t dx, std::int32_t flip, float mean,
                                      float stddev) const {
    const std::int64_t source_y = y + dy;
    const std::int64_t source_x = (flip != 0 ? width - 1 - x : x) + dx;
    const bool inside = source_y >= 0 && source_y < height && source_x >= 0 && source_x < width;
    constexpr float kScale = 1.0f / 255.0f;
    const float scaled = inside ? static_cast<float>(pixels[(source_y * width + source_x) * channels + c]) * kScale : 0.0f;
    const float centred = scaled - mean;
    return centred / stddev;
  }
};

}  // namespace cohort
