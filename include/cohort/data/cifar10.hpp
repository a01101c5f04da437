#pragma once
// CIFAR-10 in its binary distribution ("CIFAR-10 binary version": cifar-10-batches-bin/ with
// data_batch_1.bin .. data_batch_5.bin and test_batch.bin). Each file holds up to 10000 records of
// 3073 bytes: the label (0-9), then 1024 red, 1024 green and 1024 blue values, row-major 32x32.
// Samples come out as (32, 32, 3) HWC. A truncated, oversized or foreign file raises DataError naming
// the file and the byte offset.
//
//   auto train = data::Cifar10::train("/data/cifar-10-batches-bin");

#include <filesystem>

#include "cohort/data/image_dataset.hpp"

namespace cohort::data {

struct Cifar10 {
  static constexpr std::int64_t kRecordBytes = 3073;
  static constexpr std::int64_t kRecordsPerFile = 10000;

  static ImageDataset train(const std::filesystem::path& directory);
  static ImageDataset test(const std::filesystem::path& directory);
  // Reads the given batch files, in order, into one data set.
  static ImageDataset read(const std::vector<std::filesystem::path>& files);
  // True when the directory holds all six files.
  static bool present(const std::filesystem::path& directory);
};

}  // namespace cohort::data
