#pragma once
// TensorBoard's event files: TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C
// of the data) around Event protocol buffers (tensorflow/core/util/event.proto and summary.proto), of
// which only what scalars and histograms need is written: wall_time, step, file_version and a Summary of
// values, each a tag with a simple_value or a HistogramProto.
//
//   EventFileWriter writer(run_dir);           // run_dir/events.out.tfevents.<seconds>.<host>.<pid>.v2
//   writer.add_scalar("epoch_loss", 0, 0.52);
//   writer.flush();

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

namespace cohort::train {

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant, so that a CRC of data that holds
// CRCs does not degenerate.
std::uint32_t masked_crc32c(std::string_view bytes);
// One TFRecord holding `data`.
std::string tfrecord(std::string_view data);

// Encoded Event messages.
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value);
// A histogram of `values` over `buckets` equal-width buckets between their least and greatest (one
// bucket when all are equal); non-finite values are left out of the buckets, the sum and the bounds.
std::string histogram_event(double wall_time, std::int64_t step, std::string_view tag, std::span<const float> values,
                            int buckets = 30);

class EventFileWriter {
 public:
  // Creates `directory` and an event file in it, starting with the file-version record. IoError naming
  // the path when it cannot.
  explicit EventFileWriter(const std::filesystem::path& directory);
  void add_scalar(std::string_view tag, std::int64_t step, double value);
  void add_histogram(std::string_view tag, std::int64_t step, std::span<const float> values);
  // Hands what was written to the file system (TensorBoard reads files as they grow). IoError when a
  // write failed.
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write(const std::string& event);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace cohort::train
