#pragma once
// Reference models, built from the public layers exactly as their Keras originals, on any device.
//
//   nn::Sequential model = nn::cifar10_cnn({32, 32, 3});

#include <cstdint>

#include "cohort/nn/sequential.hpp"

namespace cohort::nn {

// Which batch a model's batch normalization takes its training statistics from in a data-parallel job:
// each replica's own (BatchNormalization) or every replica's together (SyncBatchNormalization).
enum class BatchStatistics { PerReplica, Global };

// The Keras CIFAR-10 CNN of the SageMaker distributed-training samples: three blocks of
// [Conv2D same, BN, relu, Conv2D valid, BN, relu, MaxPooling2D 2, Dropout 0.2/0.3/0.4] with 32, 64 and
// 128 filters, then Flatten, Dense 512, relu, Dropout 0.5, Dense 10, softmax.
Sequential cifar10_cnn(const Shape& input_shape = {32, 32, 3}, std::uint64_t seed = 0, Device device = Device::CPU,
                       BatchStatistics statistics = BatchStatistics::PerReplica);

// A small CNN for 28x28 grey images: two [Conv2D same, BN, relu, MaxPooling2D] blocks with 32 and 64
// filters, then Flatten, Dense 128, relu, Dropout 0.3, Dense 10, softmax.
Sequential small_cnn(const Shape& input_shape = {28, 28, 1}, std::uint64_t seed = 0, Device device = Device::CPU,
                     BatchStatistics statistics = BatchStatistics::PerReplica);

}  // namespace cohort::nn
