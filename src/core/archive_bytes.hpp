#pragma once
// Values to and from cereal portable binary bytes, for the library's own records (checkpoint payloads,
// manifests, server statistics). Decoding failures become the caller's error type, naming `what`; no
// length read from the bytes makes anything larger than the bytes themselves be allocated.

#include <cereal/archives/portable_binary.hpp>
#include <fmt/format.h>

#include <sstream>
#include <string>
#include <string_view>

#include "cohort/core/error.hpp"
#include "core/bounded_archive.hpp"

namespace cohort {

template <typename T>
std::string to_archive_bytes(const T& value) {
  std::ostringstream out;
  {
    cereal::PortableBinaryOutputArchive archive(out);
    archive(value);
  }
  return out.str();
}

template <typename Error, typename T>
T from_archive_bytes(std::string_view bytes, std::string_view what) {
  T value{};
  try {
    BoundedInputArchive archive(bytes);
    archive(value);
  } catch (const cereal::Exception& e) {
    throw Error(fmt::format("{} cannot be decoded: {}", what, e.what()));
  } catch (const DataError& e) {  // a record's own check, e.g. a tensor's extents
    throw Error(fmt::format("{} cannot be decoded: {}", what, e.what()));
  }
  return value;
}

}  // namespace cohort
