#include "core/sealed_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cohort/core/check.hpp"

namespace cohort {
namespace {

// magic, version (u32), payload bytes (u64), payload CRC-32 (u32), all little-endian
constexpr std::size_t kMagicBytes = 8;
constexpr std::size_t kHeaderBytes = kMagicBytes + 4 + 8 + 4;

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
  out.append(bytes, sizeof(T));
}

template <typename T>
T get(const std::string& in, std::size_t offset) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[offset + i])) << (8 * i);
  return static_cast<T>(value);
}

std::string_view kind_of(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::directory: return "a directory";
    case std::filesystem::file_type::block: return "a block device";
    case std::filesystem::file_type::character: return "a character device";
    case std::filesystem::file_type::fifo: return "a FIFO";
    case std::filesystem::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

std::string read_whole_file(const std::filesystem::path& path, std::string_view what) {
  // Only a regular file has an end: a FIFO would block the reader and a device feed it without end.
  std::error_code error;
  const auto type = std::filesystem::status(path, error).type();
  if (!error && type != std::filesystem::file_type::regular)
    throw DataError(fmt::format("{} {}: is {}, not a file", what, path.string(), kind_of(type)));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{} {}: cannot open it: {}", what, path.string(), std::strerror(errno)));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// Removes `path`.tmp.<pid> files left by processes that no longer run (a crash, or a write that failed
// before this code removed its own), so that a full disk does not stay full across restarts.
void remove_stale_temporaries(const std::filesystem::path& directory, const std::filesystem::path& path) {
  const std::string prefix = path.filename().string() + ".tmp.";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    pid_t pid = 0;
    const char* digits = name.c_str() + prefix.size();
    const auto [end, parsed] = std::from_chars(digits, name.c_str() + name.size(), pid);
    if (parsed != std::errc() || *end != '\0' || pid <= 0) continue;
    if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) std::filesystem::remove(entry.path(), error);
  }
}

void fsync_path(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::uint32_t crc32_of(const void* data, std::size_t size) {
  auto bytes = static_cast<const Bytef*>(data);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, bytes, chunk);
    bytes += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

void write_file_atomically(const std::filesystem::path& path, const std::string& bytes) {
  // The rename below would replace a device node or a FIFO, and fail late with a misleading reason over a
  // directory: only a regular file, or nothing, may be where the file goes.
  std::error_code looked;
  const auto existing = std::filesystem::status(path, looked);
  if (std::filesystem::exists(existing) && !std::filesystem::is_regular_file(existing))
    throw IoError(fmt::format("cannot write {}: it exists and is not a regular file", path.string()));
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code made;
  std::filesystem::create_directories(directory, made);
  if (made) throw IoError(fmt::format("cannot create directory {}: {}", directory.string(), made.message()));
  remove_stale_temporaries(directory, path);
  const std::filesystem::path temporary = path.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const std::string reason = std::strerror(errno);
      out.close();
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);  // a partial file would keep a full disk full
      throw IoError(fmt::format("cannot write {}: {}", temporary.string(), reason));
    }
  }
  fsync_path(temporary, O_RDONLY);
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw IoError(fmt::format("cannot rename {} to {}: {}", temporary.string(), path.string(), error.message()));
  }
  fsync_path(directory, O_RDONLY | O_DIRECTORY);
}

std::uint32_t write_sealed_file(const std::filesystem::path& path, std::string_view magic, std::uint32_t version,
                                const std::string& payload) {
  COHORT_CHECK(magic.size() == kMagicBytes, "a sealed file's magic has {} characters, not {}", kMagicBytes, magic.size());
  const std::uint32_t crc = crc32_of(payload.data(), payload.size());
  std::string file(magic);
  put<std::uint32_t>(file, version);
  put<std::uint64_t>(file, payload.size());
  put<std::uint32_t>(file, crc);
  file += payload;
  write_file_atomically(path, file);
  return crc;
}

namespace {

// What a file of another of cohort's kinds is, and what reads it; empty for a magic cohort does not write.
std::string other_sealed_kind(std::string_view magic) {
  struct Kind {
    std::string_view magic, what;
  };
  constexpr Kind kinds[] = {{"COHORTMD", "a model file (nn::load_model, examples/predict)"},
                            {"COHORTWT", "a weights file (nn::load_weights into the model it was saved from)"},
                            {"COHORTCK", "a checkpoint (fit() with resume; nn::save_model writes a model file from the model)"},
                            {"COHORTPS", "a parameter server's snapshot (resumed with its checkpoint directory)"},
                            {"COHORTMF", "a parameter-server checkpoint's manifest (resumed with its checkpoint directory)"}};
  for (const Kind& kind : kinds)
    if (kind.magic == magic) return fmt::format(", but {}", kind.what);
  return {};
}

}  // namespace

std::string read_sealed_file(const std::filesystem::path& path, std::string_view magic, std::uint32_t version,
                             std::string_view what) {
  const std::string file = read_whole_file(path, what);
  const std::string name = path.string();
  if (file.size() < kHeaderBytes)
    throw DataError(fmt::format("{} {}: truncated, {} bytes is shorter than the {}-byte header", what, name, file.size(),
                                kHeaderBytes));
  if (const std::string_view found(file.data(), kMagicBytes); found != magic)
    throw DataError(fmt::format("{} {}: byte offset 0 lacks the {} magic; not a cohort {}{}", what, name, magic, what,
                                other_sealed_kind(found)));
  const auto found_version = get<std::uint32_t>(file, kMagicBytes);
  if (found_version != version)
    throw DataError(fmt::format("{} {}: format version {}, this build reads version {}", what, name, found_version, version));
  const auto size = get<std::uint64_t>(file, kMagicBytes + 4);
  if (size != file.size() - kHeaderBytes)
    throw DataError(fmt::format("{} {}: header announces {} payload bytes, the file holds {} (truncated or appended to)",
                                what, name, size, file.size() - kHeaderBytes));
  const auto expected_crc = get<std::uint32_t>(file, kMagicBytes + 12);
  const std::uint32_t actual_crc = crc32_of(file.data() + kHeaderBytes, size);
  if (expected_crc != actual_crc)
    throw DataError(fmt::format("{} {}: payload checksum {:08x} does not match the recorded {:08x}; the file is damaged",
                                what, name, actual_crc, expected_crc));
  return file.substr(kHeaderBytes);
}

bool sealed_file_exists(const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    // A link to nothing is a file that was meant to be there: starting afresh would hide its loss.
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, error)))
      throw DataError(fmt::format("{} is a link to {}, which does not exist: restore what it names, or remove the link to "
                                  "start afresh",
                                  path.string(), std::filesystem::read_symlink(path, error).string()));
    return false;
  }
  if (error) throw DataError(fmt::format("{} cannot be read: {}", path.string(), error.message()));
  return true;
}

}  // namespace cohort
