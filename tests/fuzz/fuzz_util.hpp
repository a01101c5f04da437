#pragma once
// Shared by the fuzz targets: an in-memory file with a path (memfd), so readers that take paths read the
// fuzzer's bytes without touching the disk, and a scratch directory for the readers that take one.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("cohort-fuzz", 0)) {
    if (fd_ < 0) std::abort();
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  // Replaces the contents; returns a path that opens them.
  std::filesystem::path holding(std::string_view bytes) {
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))
      std::abort();
    return "/proc/self/fd/" + std::to_string(fd_);
  }

 private:
  int fd_;
};

// A directory of this process under /dev/shm (memory), emptied on exit by nobody: the fuzzer's process
// is short-lived and the names carry its pid.
inline std::filesystem::path scratch_directory(std::string_view name) {
  const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  auto path = base / (std::string(name) + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(path);
  return path;
}

// Writes each seed (a mode byte, then the input) as a file of $COHORT_FUZZ_SEEDS when it is set: scripts/fuzz
// starts every corpus from the seeds of the build it runs, so that they follow the formats.
inline void write_seeds(const std::vector<std::string>& seeds) {
  const char* directory = std::getenv("COHORT_FUZZ_SEEDS");
  if (directory == nullptr) return;
  std::filesystem::create_directories(directory);
  for (std::size_t i = 0; i < seeds.size(); ++i)
    std::ofstream(std::filesystem::path(directory) / ("seed-" + std::to_string(i)), std::ios::binary) << seeds[i];
}

inline std::string mode(std::uint8_t number, std::string_view input) { return std::string(1, static_cast<char>(number)) + std::string(input); }

inline std::string_view rest(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data) + 1, size - 1};
}

}  // namespace fuzz
