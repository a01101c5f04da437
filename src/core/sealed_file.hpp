#pragma once
// Sealed files: an 8-byte magic, a format version, the payload size and a CRC-32 of the payload, then the
// payload. Written through a temporary file, fsync and rename, so a crash leaves the old file or the new
// one; reading checks everything and raises DataError naming the file and what is wrong with it.
// Checkpoints, parameter-server snapshots and their manifest use this container.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace cohort {

// `magic` has exactly 8 characters. Returns the CRC-32 of the payload.
std::uint32_t write_sealed_file(const std::filesystem::path& path, std::string_view magic, std::uint32_t version,
                                const std::string& payload);
// The payload; `what` names the kind of file in errors ("checkpoint").
std::string read_sealed_file(const std::filesystem::path& path, std::string_view magic, std::uint32_t version,
                             std::string_view what);

// Whether a file is at `path`: false when nothing is there; DataError naming it when that cannot be told
// (a loop of symbolic links, a directory that may not be read), rather than a raw filesystem error.
// Reading refuses anything but a regular file (a directory, a device, a FIFO) with DataError.
bool sealed_file_exists(const std::filesystem::path& path);
// Writes `bytes` to `path` through a temporary file, fsync and rename.
void write_file_atomically(const std::filesystem::path& path, const std::string& bytes);

std::uint32_t crc32_of(const void* data, std::size_t size);

}  // namespace cohort
