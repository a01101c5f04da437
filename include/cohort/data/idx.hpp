#pragma once
// IDX files (the MNIST and Fashion-MNIST format), gzipped or plain: a magic of two zero bytes, a type
// byte (0x08: unsigned byte), a dimension count, big-endian 32-bit extents, then the values.
// FashionMnist reads the four files as Debian's dataset-fashion-mnist installs them.
//
//   auto train = data::FashionMnist::train();   // /usr/share/datasets/fashion-mnist
//   auto test  = data::FashionMnist::test();

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/data/image_dataset.hpp"

namespace cohort::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
};

// Reads an unsigned-byte IDX file; throws DataError naming the file and byte offset on any defect.
IdxArray read_idx(const std::filesystem::path& path);

struct FashionMnist {
  static constexpr const char* kDebianDirectory = "/usr/share/datasets/fashion-mnist";

  static ImageDataset train(const std::filesystem::path& directory = kDebianDirectory);
  static ImageDataset test(const std::filesystem::path& directory = kDebianDirectory);
  // Pairs an image file (N, H, W) with a label file (N) into an (H, W, 1) data set.
  static ImageDataset read(const std::filesystem::path& images, const std::filesystem::path& labels);
  static bool present(const std::filesystem::path& directory = kDebianDirectory);
  // Why `directory` does not hold the four files ("/data/fm: No such file or directory"); empty when it does.
  static std::string absence(const std::filesystem::path& directory = kDebianDirectory);
};

}  // namespace cohort::data
