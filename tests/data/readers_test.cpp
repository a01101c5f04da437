// The CIFAR-10 and IDX readers on valid files they write themselves, on damaged and foreign files,
// and on Debian's real Fashion-MNIST when it is installed.
#include <zlib.h>

#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/data/cifar10.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/data/synthetic.hpp"
#include "test_util.hpp"

using namespace cohort;
using test_util::ScratchDirectory;

namespace {

std::vector<std::uint8_t> cifar_records(int count) {
  std::vector<std::uint8_t> bytes;
  for (int r = 0; r < count; ++r) {
    bytes.push_back(static_cast<std::uint8_t>(r % 10));
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 1024; ++p) bytes.push_back(static_cast<std::uint8_t>((p + 100 * c + r) % 256));
  }
  return bytes;
}

void write(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::vector<std::uint8_t> idx_header(const std::vector<std::uint32_t>& dims) {
  std::vector<std::uint8_t> bytes = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<std::uint8_t>(d >> s));
  return bytes;
}

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::uint8_t fill_mod) {
  std::vector<std::uint8_t> bytes = idx_header(dims);
  std::size_t count = 1;
  for (auto d : dims) count *= d;
  for (std::size_t i = 0; i < count; ++i) bytes.push_back(static_cast<std::uint8_t>(i % fill_mod));
  return bytes;
}

// Runs `read` and requires a DataError whose message contains every fragment.
template <typename Read>
void require_data_error(Read&& read, std::initializer_list<std::string> fragments) {
  try {
    read();
    FAIL("expected a DataError");
  } catch (const DataError& e) {
    const std::string message = e.what();
    for (const auto& fragment : fragments) {
      INFO(message);
      CHECK(message.find(fragment) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("CIFAR-10 records become HWC samples with their labels", "[data][cifar]") {
  ScratchDirectory dir("cifar_ok");
  write(dir.path() / "one.bin", cifar_records(3));
  const auto set = data::Cifar10::read({dir.path() / "one.bin"});
  REQUIRE(set.size() == 3);
  CHECK(set.sample_shape() == Shape({32, 32, 3}));
  std::vector<float> sample(32 * 32 * 3);
  CHECK(set.load(2, sample.data()) == 2);
  // pixel 5 of record 2: R = (5 + 2), G = (5 + 100 + 2), B = (5 + 200 + 2)
  CHECK(sample[5 * 3 + 0] == Approx(7 / 255.0));
  CHECK(sample[5 * 3 + 1] == Approx(107 / 255.0));
  CHECK(sample[5 * 3 + 2] == Approx(207 / 255.0));
  CHECK_FALSE(data::Cifar10::present(dir.path()));
}

TEST_CASE("CIFAR-10 rejects truncated, oversized, foreign and missing files with file and offset", "[data][cifar]") {
  ScratchDirectory dir("cifar_bad");
  auto bytes = cifar_records(2);
  bytes.resize(bytes.size() - 100);
  write(dir.path() / "truncated.bin", bytes);
  require_data_error([&] { data::Cifar10::read({dir.path() / "truncated.bin"}); },
                     {"truncated.bin", "truncated", "byte offset 3073"});

  auto foreign = cifar_records(2);
  foreign[3073] = 57;
  write(dir.path() / "foreign.bin", foreign);
  require_data_error([&] { data::Cifar10::read({dir.path() / "foreign.bin"}); }, {"foreign.bin", "byte offset 3073", "label 57"});

  std::vector<std::uint8_t> big(static_cast<std::size_t>(data::Cifar10::kRecordBytes * (data::Cifar10::kRecordsPerFile + 1)), 1);
  write(dir.path() / "big.bin", big);
  require_data_error([&] { data::Cifar10::read({dir.path() / "big.bin"}); }, {"big.bin", "oversized", "30730000"});

  write(dir.path() / "empty.bin", {});
  require_data_error([&] { data::Cifar10::read({dir.path() / "empty.bin"}); }, {"empty.bin", "empty"});
  require_data_error([&] { data::Cifar10::train(dir.path()); }, {"data_batch_1.bin"});
}

TEST_CASE("IDX files are read plain and gzipped", "[data][idx]") {
  ScratchDirectory dir("idx_ok");
  write(dir.path() / "images", idx_bytes({4, 3, 2}, 251));
  write_gz(dir.path() / "labels.gz", idx_bytes({4}, 10));
  const auto images = data::read_idx(dir.path() / "images");
  CHECK(images.dims == std::vector<std::int64_t>{4, 3, 2});
  CHECK(images.values.size() == 24);
  const auto set = data::FashionMnist::read(dir.path() / "images", dir.path() / "labels.gz");
  CHECK(set.size() == 4);
  CHECK(set.sample_shape() == Shape({3, 2, 1}));
  std::vector<float> sample(6);
  CHECK(set.load(3, sample.data()) == 3);
  CHECK(sample[0] == Approx(18 / 255.0));
}

TEST_CASE("IDX rejects damaged and foreign files with file and offset", "[data][idx]") {
  ScratchDirectory dir("idx_bad");
  auto truncated = idx_bytes({10, 4, 4}, 200);
  truncated.resize(truncated.size() - 7);
  write_gz(dir.path() / "truncated.gz", truncated);
  require_data_error([&] { data::read_idx(dir.path() / "truncated.gz"); }, {"truncated.gz", "truncated", "byte offset 169"});

  auto trailing = idx_bytes({3}, 10);
  trailing.push_back(9);
  write(dir.path() / "trailing", trailing);
  require_data_error([&] { data::read_idx(dir.path() / "trailing"); }, {"trailing", "oversized", "byte offset 11"});

  write(dir.path() / "foreign", {0x89, 'P', 'N', 'G', 1, 2, 3, 4});
  require_data_error([&] { data::read_idx(dir.path() / "foreign"); }, {"foreign", "byte offset 0", "magic"});

  write(dir.path() / "floats", {0, 0, 0x0D, 1, 0, 0, 0, 1, 1, 2, 3, 4});
  require_data_error([&] { data::read_idx(dir.path() / "floats"); }, {"floats", "type 0x0d"});

  write(dir.path() / "short", {0, 0});
  require_data_error([&] { data::read_idx(dir.path() / "short"); }, {"short", "header"});

  // A gzip stream whose body is garbage: zlib's error surfaces as a DataError, never a crash.
  auto gz = std::vector<std::uint8_t>{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 0; i < 64; ++i) gz.push_back(static_cast<std::uint8_t>(i * 37 + 11));
  write(dir.path() / "garbage.gz", gz);
  CHECK_THROWS_AS(data::read_idx(dir.path() / "garbage.gz"), DataError);

  // A damaged gzip file says so, with the uncompressed range it was reading or the trailer that failed,
  // not the offset where the values begin.
  write_gz(dir.path() / "big.gz", idx_bytes({3, 1024, 1024}, 251));
  std::vector<std::uint8_t> big;
  {
    std::ifstream in(dir.path() / "big.gz", std::ios::binary);
    big.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto bad_trailer = big;
  bad_trailer[bad_trailer.size() - 6] ^= 0xff;  // the CRC-32
  write(dir.path() / "bad_trailer.gz", bad_trailer);
  require_data_error([&] { data::read_idx(dir.path() / "bad_trailer.gz"); },
                     {"bad_trailer.gz", "gzip trailer does not match", "damaged somewhere"});
  auto bad_body = big;
  for (std::size_t i = big.size() / 2; i < big.size() / 2 + 64; ++i) bad_body[i] = static_cast<std::uint8_t>(i * 131);
  write(dir.path() / "bad_body.gz", bad_body);
  try {
    data::read_idx(dir.path() / "bad_body.gz");
    FAIL("a damaged gzip body was read");
  } catch (const DataError& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains("bad_body.gz"));
    CHECK_THAT(message, Catch::Contains("gzip trailer does not match") || Catch::Contains("corrupt compressed data at or before"));
    CHECK_THAT(message, !Catch::Contains("uncompressed bytes 16 to"));
  }

  write(dir.path() / "images", idx_bytes({2, 2, 2}, 200));
  write(dir.path() / "labels", idx_bytes({3}, 10));
  require_data_error([&] { data::FashionMnist::read(dir.path() / "images", dir.path() / "labels"); }, {"labels", "2 labels"});
  write(dir.path() / "labels", idx_bytes({2}, 200));
  write(dir.path() / "badlabels", {0, 0, 8, 1, 0, 0, 0, 2, 3, 42});
  require_data_error([&] { data::FashionMnist::read(dir.path() / "images", dir.path() / "badlabels"); },
                     {"badlabels", "byte offset 9", "label 42"});
  require_data_error([&] { data::read_idx(dir.path() / "missing.gz"); }, {"missing.gz", "cannot open"});
}

TEST_CASE("IDX headers that promise too much are refused before memory is spent on them", "[data][idx]") {
  ScratchDirectory dir("idx_header");
  // Extents whose product overflows 64 bits: refused at the dimension that passes 2^32, no arithmetic overflow.
  write(dir.path() / "huge", idx_header({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}));
  require_data_error([&] { data::read_idx(dir.path() / "huge"); }, {"huge", "byte offset 8", "more than 2^32"});
  // 16 bytes of header promising 2^32 values: truncated at the first value, without allocating 4 GiB.
  write(dir.path() / "promises.gz", idx_header({65536, 65536}));
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  require_data_error([&] { data::read_idx(dir.path() / "promises.gz"); },
                     {"promises.gz", "truncated in the values", "byte offset 12", "0 of 4294967296"});
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  CHECK(after.ru_maxrss - before.ru_maxrss < 256 * 1024);  // kilobytes: far below 4 GiB
}

TEST_CASE("Debian's Fashion-MNIST reads as 60000 + 10000 labelled 28x28 images", "[data][idx][fashion]") {
  if (!data::FashionMnist::present()) {
    WARN("dataset-fashion-mnist is not installed; skipping");
    return;
  }
  const auto test = data::FashionMnist::test();
  CHECK(test.size() == 10000);
  CHECK(test.sample_shape() == Shape({28, 28, 1}));
  std::vector<int> per_class(10, 0);
  for (auto label : test.labels()) ++per_class[label];
  for (int count : per_class) CHECK(count == 1000);
}

TEST_CASE("the synthetic set is reproducible from its seed", "[data]") {
  const auto a = data::make_synthetic({.samples = 64, .seed = 5});
  const auto b = data::make_synthetic({.samples = 64, .seed = 5});
  const auto c = data::make_synthetic({.samples = 64, .seed = 6});
  CHECK(a.labels() == b.labels());
  CHECK(a.labels() != c.labels());
}
