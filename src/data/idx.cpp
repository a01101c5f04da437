#include "cohort/data/idx.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "cohort/core/check.hpp"

namespace cohort::data {
namespace {

constexpr std::int64_t kMaxValues = std::int64_t{1} << 32;
// Values are read in steps of this size, so that a header promising more than the file holds costs no more
// memory than the file.
constexpr std::int64_t kReadStep = std::int64_t{16} << 20;

// zlib reads gzip and plain files alike; this wrapper closes the handle and names the file in errors.
class GzFile {
 public:
  explicit GzFile(const std::filesystem::path& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) throw DataError(fmt::format("IDX file {}: cannot open it: {}", path.string(), std::strerror(errno)));
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to `count` bytes; returns how many were read. Reads go in pieces of 1 MiB, so that an error
  // in the compressed stream is placed within one piece of the uncompressed bytes.
  std::int64_t read(std::uint8_t* out, std::int64_t count) {
    constexpr std::int64_t kPiece = 1 << 20;
    std::int64_t done = 0;
    while (done < count) {
      const auto piece = static_cast<unsigned>(std::min<std::int64_t>(count - done, kPiece));
      const int got = gzread(file_, out + done, piece);
      if (got < 0) throw damaged(offset_ + done, piece);
      if (got == 0) break;
      done += got;
    }
    offset_ += done;
    return done;
  }
  std::int64_t offset() const { return offset_; }

  // The gzip trailer's checksum covers every byte, so a mismatch says the file is damaged, not where.
  DataError damaged(std::int64_t offset, std::int64_t piece) {
    int code = 0;
    std::string reason = gzerror(file_, &code);
    if (const std::string prefix = path_.string() + ": "; reason.starts_with(prefix)) reason.erase(0, prefix.size());
    const auto compressed_offset = static_cast<std::int64_t>(gzoffset(file_));
    if (reason.find("check") != std::string::npos)
      return DataError(fmt::format("IDX file {}: the gzip trailer does not match the decompressed bytes ({}): the file is "
                                   "damaged somewhere in its {} compressed bytes",
                                   path_.string(), reason, compressed_offset));
    return DataError(fmt::format("IDX file {}: corrupt compressed data at or before compressed byte {}, in the "
                                 "uncompressed bytes {} to {}: {}",
                                 path_.string(), compressed_offset, offset, offset + piece, reason));
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  gzFile file_;
  std::int64_t offset_ = 0;
};

void read_exactly(GzFile& file, std::uint8_t* out, std::int64_t count, const char* what) {
  const std::int64_t start = file.offset();
  const std::int64_t got = file.read(out, count);
  if (got != count)
    throw DataError(fmt::format("IDX file {}: truncated in the {} at byte offset {}: {} of {} bytes present",
                                file.path().string(), what, start + got, got, count));
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path) {
  GzFile file(path);
  std::uint8_t header[4];
  read_exactly(file, header, 4, "header");
  if (header[0] != 0 || header[1] != 0)
    throw DataError(fmt::format("IDX file {}: byte offset 0 does not start with the IDX magic 00 00 (a foreign file?)",
                                path.string()));
  if (header[2] != 0x08)
    throw DataError(fmt::format("IDX file {}: byte offset 2 holds type 0x{:02x}; only unsigned bytes (0x08) are supported",
                                path.string(), header[2]));
  if (header[3] < 1 || header[3] > 4)
    throw DataError(fmt::format("IDX file {}: byte offset 3 holds {} dimensions, expected 1 to 4", path.string(), header[3]));
  IdxArray array;
  std::int64_t count = 1;
  for (int d = 0; d < header[3]; ++d) {
    std::uint8_t be[4];
    read_exactly(file, be, 4, "dimensions");
    const std::int64_t extent =
        (std::int64_t{be[0]} << 24) | (std::int64_t{be[1]} << 16) | (std::int64_t{be[2]} << 8) | std::int64_t{be[3]};
    // Checked before multiplying, so that the product cannot overflow.
    if (extent > 0 && count > kMaxValues / extent)
      throw DataError(fmt::format("IDX file {}: dimensions at byte offset {} describe more than 2^32 values",
                                  path.string(), 4 + 4 * d));
    count *= extent;
    array.dims.push_back(extent);
  }
  const std::int64_t values_start = file.offset();
  for (std::int64_t have = 0; have < count;) {
    const std::int64_t step = std::min(kReadStep, count - have);
    array.values.resize(static_cast<std::size_t>(have + step));
    const std::int64_t got = file.read(array.values.data() + have, step);
    have += got;
    if (got != step)
      throw DataError(fmt::format("IDX file {}: truncated in the values at byte offset {}: {} of {} bytes present",
                                  path.string(), values_start + have, have, count));
  }
  std::uint8_t extra;
  if (file.read(&extra, 1) != 0)
    throw DataError(fmt::format("IDX file {}: oversized, data continues past byte offset {} where the {} declared "
                                "values end",
                                path.string(), file.offset() - 1, count));
  return array;
}

ImageDataset FashionMnist::read(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxArray pixels = read_idx(images);
  IdxArray classes = read_idx(labels);
  if (pixels.dims.size() != 3)
    throw DataError(fmt::format("IDX file {}: expected images (N, H, W), found {} dimensions", images.string(),
                                pixels.dims.size()));
  if (classes.dims.size() != 1 || classes.dims[0] != pixels.dims[0])
    throw DataError(fmt::format("IDX file {}: expected {} labels to match {}", labels.string(), pixels.dims[0],
                                images.string()));
  for (std::size_t i = 0; i < classes.values.size(); ++i)
    if (classes.values[i] > 9)
      throw DataError(fmt::format("IDX file {}: byte offset {} holds label {}, not a class 0-9", labels.string(), 8 + i,
                                  classes.values[i]));
  return ImageDataset({pixels.dims[1], pixels.dims[2], 1}, 10, std::move(pixels.values), std::move(classes.values),
                      fmt::format("Fashion-MNIST {}", images.string()));
}

ImageDataset FashionMnist::train(const std::filesystem::path& directory) {
  return read(directory / "train-images-idx3-ubyte.gz", directory / "train-labels-idx1-ubyte.gz");
}

ImageDataset FashionMnist::test(const std::filesystem::path& directory) {
  return read(directory / "t10k-images-idx3-ubyte.gz", directory / "t10k-labels-idx1-ubyte.gz");
}

bool FashionMnist::present(const std::filesystem::path& directory) { return absence(directory).empty(); }

std::string FashionMnist::absence(const std::filesystem::path& directory) {
  struct stat status {};
  if (::stat(directory.c_str(), &status) != 0) return fmt::format("{}: {}", directory.string(), std::strerror(errno));
  if (!S_ISDIR(status.st_mode)) return fmt::format("{}: not a directory", directory.string());
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"}) {
    const auto file = directory / f;
    if (::access(file.c_str(), R_OK) != 0) return fmt::format("{}: {}", file.string(), std::strerror(errno));
  }
  return {};
}

}  // namespace cohort::data
