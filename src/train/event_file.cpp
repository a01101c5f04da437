#include "event_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <limits>
#include <vector>

#include "cohort/core/error.hpp"
#include "core/crc32c.hpp"

namespace cohort::train {
namespace {

// Protocol-buffer wire format: a key is (field number << 3) | wire type.
enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, std::uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }

template <typename T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and AArch64 Linux are little-endian, as the format
  out.append(bytes, sizeof(T));
}

void put_double(std::string& out, std::uint32_t field, double value) {
  put_key(out, field, kFixed64);
  put_little_endian(out, value);
}

void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_packed_doubles(std::string& out, std::uint32_t field, const std::vector<double>& values) {
  std::string packed;
  for (double v : values) put_little_endian(packed, v);
  put_bytes(out, field, packed);
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(double wall_time, std::int64_t step) {
  std::string out;
  put_double(out, 1, wall_time);
  put_key(out, 2, kVarint);
  put_varint(out, static_cast<std::uint64_t>(step));
  return out;
}

// Summary { repeated Value value = 1; }, Value { string tag = 1; float simple_value = 2; HistogramProto histo = 5; }
std::string summary_event(double wall_time, std::int64_t step, std::string_view tag, const std::string& encoded_value) {
  std::string value;
  put_bytes(value, 1, tag);
  value += encoded_value;
  std::string summary;
  put_bytes(summary, 1, value);
  std::string out = event(wall_time, step);
  put_bytes(out, 5, summary);
  return out;
}

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c_of(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_little_endian(length, static_cast<std::uint64_t>(data.size()));
  std::string out = length;
  put_little_endian(out, masked_crc32c(length));
  out.append(data);
  put_little_endian(out, masked_crc32c(data));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string out;
  put_double(out, 1, wall_time);
  put_bytes(out, 3, "brain.Event:2");
  return out;
}

std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::string encoded;
  put_key(encoded, 2, kFixed32);
  put_little_endian(encoded, value);
  return summary_event(wall_time, step, tag, encoded);
}

std::string histogram_event(double wall_time, std::int64_t step, std::string_view tag, std::span<const float> values,
                            int buckets) {
  double low = std::numeric_limits<double>::infinity(), high = -low, sum = 0, sum_squares = 0, count = 0;
  for (float v : values) {
    if (!std::isfinite(v)) continue;
    low = std::min(low, double{v});
    high = std::max(high, double{v});
    sum += v;
    sum_squares += double{v} * v;
    ++count;
  }
  if (count == 0) low = high = 0;
  const int used = high > low ? std::max(buckets, 1) : 1;
  const double width = (high - low) / used;
  // Each bucket counts the values up to its limit, from the previous one's (TensorBoard's reading).
  std::vector<double> limits(static_cast<std::size_t>(used)), counts(static_cast<std::size_t>(used), 0.0);
  for (int b = 0; b < used; ++b) limits[static_cast<std::size_t>(b)] = b + 1 == used ? high : low + width * (b + 1);
  for (float v : values) {
    if (!std::isfinite(v)) continue;
    const int b = width > 0 ? std::min(used - 1, static_cast<int>((v - low) / width)) : 0;
    ++counts[static_cast<std::size_t>(b)];
  }
  // HistogramProto { double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5; repeated double bucket_limit = 6 [packed], bucket = 7 [packed]; }
  std::string histogram;
  put_double(histogram, 1, low);
  put_double(histogram, 2, high);
  put_double(histogram, 3, count);
  put_double(histogram, 4, sum);
  put_double(histogram, 5, sum_squares);
  put_packed_doubles(histogram, 6, limits);
  put_packed_doubles(histogram, 7, counts);
  std::string encoded;
  put_bytes(encoded, 5, histogram);
  return summary_event(wall_time, step, tag, encoded);
}

EventFileWriter::EventFileWriter(const std::filesystem::path& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw IoError(fmt::format("TensorBoard: cannot create {}: {}", directory.string(), error.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = seconds_since_epoch();
  path_ = directory / fmt::format("events.out.tfevents.{}.{}.{}.v2", static_cast<std::int64_t>(now), host, ::getpid());
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw IoError(fmt::format("TensorBoard: cannot write {}: {}", path_.string(), std::strerror(errno)));
  write(file_version_event(now));
  flush();
}

void EventFileWriter::add_scalar(std::string_view tag, std::int64_t step, double value) {
  write(scalar_event(seconds_since_epoch(), step, tag, static_cast<float>(value)));
}

void EventFileWriter::add_histogram(std::string_view tag, std::int64_t step, std::span<const float> values) {
  write(histogram_event(seconds_since_epoch(), step, tag, values));
}

void EventFileWriter::write(const std::string& event) { out_ << tfrecord(event); }

void EventFileWriter::flush() {
  out_.flush();
  if (!out_) throw IoError(fmt::format("TensorBoard: cannot write {}: {}", path_.string(), std::strerror(errno)));
}

}  // namespace cohort::train
