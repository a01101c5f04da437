#include "cohort/data/cifar10.hpp"

#include <fstream>

#include "cohort/core/check.hpp"

namespace cohort::data {
namespace {

constexpr std::int64_t kSide = 32, kPlane = kSide * kSide;

// Appends the records of one batch file, converting planar RGB to HWC.
void append_file(const std::filesystem::path& path, std::vector<std::uint8_t>& pixels, std::vector<std::uint8_t>& labels) {
  std::error_code error;
  const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(path, error));
  if (error) throw DataError(fmt::format("CIFAR-10 file {}: cannot read it: {}", path.string(), error.message()));
  if (bytes == 0) throw DataError(fmt::format("CIFAR-10 file {}: empty, expected 3073-byte records", path.string()));
  if (bytes > Cifar10::kRecordsPerFile * Cifar10::kRecordBytes)
    throw DataError(fmt::format("CIFAR-10 file {}: oversized, {} bytes; data continues past byte offset {} where "
                                "{} records end (a foreign file?)",
                                path.string(), bytes, Cifar10::kRecordsPerFile * Cifar10::kRecordBytes,
                                Cifar10::kRecordsPerFile));
  if (bytes % Cifar10::kRecordBytes != 0)
    throw DataError(fmt::format("CIFAR-10 file {}: truncated, the record at byte offset {} has {} of {} bytes",
                                path.string(), bytes / Cifar10::kRecordBytes * Cifar10::kRecordBytes,
                                bytes % Cifar10::kRecordBytes, Cifar10::kRecordBytes));
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(bytes));
  if (!in.read(reinterpret_cast<char*>(raw.data()), bytes))
    throw DataError(fmt::format("CIFAR-10 file {}: read failed before byte offset {}", path.string(), in.gcount()));
  const std::int64_t records = bytes / Cifar10::kRecordBytes;
  const std::size_t base = pixels.size();
  pixels.resize(base + static_cast<std::size_t>(records * kPlane * 3));
  for (std::int64_t r = 0; r < records; ++r) {
    const std::uint8_t* record = raw.data() + r * Cifar10::kRecordBytes;
    if (record[0] > 9)
      throw DataError(fmt::format("CIFAR-10 file {}: byte offset {} holds label {}, not a class 0-9 (a foreign file?)",
                                  path.string(), r * Cifar10::kRecordBytes, record[0]));
    labels.push_back(record[0]);
    std::uint8_t* out = pixels.data() + base + r * kPlane * 3;
    for (std::int64_t p = 0; p < kPlane; ++p)
      for (std::int64_t c = 0; c < 3; ++c) out[p * 3 + c] = record[1 + c * kPlane + p];
  }
}

std::vector<std::filesystem::path> train_files(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i <= 5; ++i) files.push_back(directory / fmt::format("data_batch_{}.bin", i));
  return files;
}

}  // namespace

ImageDataset Cifar10::read(const std::vector<std::filesystem::path>& files) {
  std::vector<std::uint8_t> pixels, labels;
  for (const auto& file : files) append_file(file, pixels, labels);
  const std::string what = files.size() == 1 ? files[0].string() : files[0].parent_path().string();
  return ImageDataset({kSide, kSide, 3}, 10, std::move(pixels), std::move(labels), fmt::format("CIFAR-10 {}", what));
}

ImageDataset Cifar10::train(const std::filesystem::path& directory) { return read(train_files(directory)); }

ImageDataset Cifar10::test(const std::filesystem::path& directory) { return read({directory / "test_batch.bin"}); }

bool Cifar10::present(const std::filesystem::path& directory) {
  auto files = train_files(directory);
  files.push_back(directory / "test_batch.bin");
  for (const auto& f : files)
    if (!std::filesystem::is_regular_file(f)) return false;
  return true;
}

}  // namespace cohort::data
