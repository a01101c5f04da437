// The dataset readers on any file: IDX (plain or gzip) and CIFAR-10 binary batches. Each input must read
// or fail with DataError, never crash, never allocate beyond what the file can hold.
#include <zlib.h>

#include "cohort/core/error.hpp"
#include "cohort/data/cifar10.hpp"
#include "cohort/data/idx.hpp"
#include "fuzz_util.hpp"

using namespace cohort;

namespace {

std::string idx_file(const std::vector<std::uint32_t>& dims) {
  std::string bytes = {0, 0, 8, static_cast<char>(dims.size())};
  std::size_t count = 1;
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(d >> shift));
    count *= d;
  }
  for (std::size_t i = 0; i < count; ++i) bytes.push_back(static_cast<char>(i * 7));
  return bytes;
}

std::string gzipped(const std::string& bytes) {
  uLongf size = compressBound(bytes.size()) + 32;
  std::string out(size, '\0');
  z_stream stream{};
  deflateInit2(&stream, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // 16: a gzip wrapper
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(size);
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::string cifar_records(int count) {
  std::string bytes;
  for (int r = 0; r < count; ++r) {
    bytes.push_back(static_cast<char>(r % 10));
    for (int i = 0; i < 3072; ++i) bytes.push_back(static_cast<char>((i + r) % 256));
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::write_seeds({fuzz::mode(0, idx_file({3, 4, 4})), fuzz::mode(0, idx_file({10})),
                     fuzz::mode(0, gzipped(idx_file({2, 28, 28}))), fuzz::mode(1, cifar_records(2))});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static fuzz::MemoryFile file;
  if (size == 0) return 0;
  const auto path = file.holding(fuzz::rest(data, size));
  try {
    if (data[0] % 2 == 0) data::read_idx(path);
    else data::Cifar10::read({path});
  } catch (const DataError&) {
  }
  return 0;
}
