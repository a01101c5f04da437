#pragma once
// ServerStats on the wire (the answer to a Stats request), as a cereal portable binary archive.

#include <string>

#include "cohort/ps/stats.hpp"

namespace cohort::ps {

std::string encode_stats(const ServerStats& stats);
// Throws ProtocolError when the bytes do not decode.
ServerStats decode_stats(const std::string& bytes);

}  // namespace cohort::ps
