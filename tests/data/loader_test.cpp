#include <catch2/catch.hpp>
#include <chrono>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/mapped_dataset.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/tensor/ops.hpp"

using namespace cohort;

namespace {

// Sample i is filled with the value i, so batches reveal which samples they hold.
struct IndexDataset : data::Dataset {
  std::int64_t count;
  std::int64_t fail_at = -1;
  explicit IndexDataset(std::int64_t n) : count(n) {}
  std::int64_t size() const override { return count; }
  Shape sample_shape() const override { return {2, 2, 1}; }
  int num_classes() const override { return 10; }
  std::string description() const override { return "index"; }
  int load(std::int64_t index, float* out) const override {
    if (index == fail_at) throw DataError("sample " + std::to_string(index) + " is unreadable");
    std::fill_n(out, 4, static_cast<float>(index));
    return static_cast<int>(index % 10);
  }
};

std::vector<std::int64_t> epoch_indices(const data::DataLoader& loader, std::int64_t epoch, std::int64_t first = 0) {
  std::vector<std::int64_t> seen;
  auto batches = loader.epoch(epoch, first);
  while (auto batch = batches->next())
    for (std::int64_t i = 0; i < batch->labels.numel(); ++i) seen.push_back(static_cast<std::int64_t>(batch->images.data()[i * 4]));
  return seen;
}

}  // namespace

TEST_CASE("an epoch visits every sample exactly once, in a seeded order", "[data][loader]") {
  const IndexDataset set(103);
  const data::DataLoader loader(set, {.batch_size = 10, .seed = 7});
  CHECK(loader.batches_per_epoch() == 11);
  const auto order = epoch_indices(loader, 0);
  CHECK(order.size() == 103);
  CHECK(std::set<std::int64_t>(order.begin(), order.end()).size() == 103);
  CHECK(order == epoch_indices(data::DataLoader(set, {.batch_size = 10, .seed = 7}), 0));
  CHECK(order != epoch_indices(loader, 1));
  CHECK(order != epoch_indices(data::DataLoader(set, {.batch_size = 10, .seed = 8}), 0));
  const data::DataLoader sequential(set, {.batch_size = 10, .shuffle = false});
  const auto in_order = epoch_indices(sequential, 0);
  CHECK(in_order.front() == 0);
  CHECK(in_order.back() == 102);
}

TEST_CASE("the tail batch is kept or dropped on request, resuming mid-epoch continues the same order", "[data][loader]") {
  const IndexDataset set(25);
  const data::DataLoader keep(set, {.batch_size = 10, .seed = 1});
  const data::DataLoader drop(set, {.batch_size = 10, .seed = 1, .drop_remainder = true});
  CHECK(keep.batches_per_epoch() == 3);
  CHECK(drop.batches_per_epoch() == 2);
  CHECK(epoch_indices(drop, 0).size() == 20);
  const auto full = epoch_indices(keep, 3);
  const auto tail = epoch_indices(keep, 3, 1);
  CHECK(std::vector<std::int64_t>(full.begin() + 10, full.end()) == tail);
  CHECK(epoch_indices(keep, 3, 3).empty());
  CHECK_THROWS_AS(keep.epoch(0, 4), InvalidArgument);
}

TEST_CASE("prefetching and inline loading give the same batches", "[data][loader]") {
  const auto set = data::make_synthetic({.samples = 50, .sample_shape = {6, 6, 2}});
  const data::DataLoader ahead(set, {.batch_size = 8, .seed = 3, .transforms = {data::random_crop(2), data::random_flip_horizontal()}, .prefetch = 3});
  const data::DataLoader inline_(set, {.batch_size = 8, .seed = 3, .transforms = {data::random_crop(2), data::random_flip_horizontal()}, .prefetch = 0});
  auto a = ahead.epoch(2);
  auto b = inline_.epoch(2);
  for (;;) {
    auto x = a->next();
    auto y = b->next();
    REQUIRE(x.has_value() == y.has_value());
    if (!x) break;
    CHECK(x->images.to_vector() == y->images.to_vector());
    CHECK(x->labels.to_vector() == y->labels.to_vector());
  }
}

TEST_CASE("a failing sample surfaces as the dataset's error from next(), never a hang", "[data][loader]") {
  IndexDataset set(40);
  set.fail_at = 33;
  const data::DataLoader loader(set, {.batch_size = 4, .shuffle = false, .prefetch = 2});
  auto epoch = loader.epoch(0);
  int good = 0;
  CHECK_THROWS_WITH(([&] { while (epoch->next()) ++good; })(), Catch::Contains("sample 33"));
  CHECK(good == 8);
}

TEST_CASE("dropping an epoch early stops its producer promptly", "[data][loader]") {
  const IndexDataset set(100000);
  const data::DataLoader loader(set, {.batch_size = 16, .prefetch = 4});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto epoch = loader.epoch(i);
    epoch->next();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("augmentation: crops shift with zero fill, flips mirror, normalization standardizes", "[data][transforms]") {
  const Shape shape{2, 3, 1};
  std::vector<float> image = {1, 2, 3, 4, 5, 6};
  std::mt19937_64 rng(1);
  auto flip = data::random_flip_horizontal();
  std::set<std::vector<float>> outcomes;
  for (int i = 0; i < 20; ++i) {
    auto copy = image;
    flip(copy, shape, rng);
    outcomes.insert(copy);
  }
  CHECK(outcomes == std::set<std::vector<float>>{{1, 2, 3, 4, 5, 6}, {3, 2, 1, 6, 5, 4}});

  auto crop = data::random_crop(1);
  for (int i = 0; i < 20; ++i) {
    auto copy = image;
    crop(copy, shape, rng);
    double total = 0;
    for (float v : copy) {
      CHECK((v == 0 || std::find(image.begin(), image.end(), v) != image.end()));
      total += v;
    }
    CHECK(total <= 21);
  }

  const auto set = data::make_synthetic({.samples = 200, .sample_shape = {4, 4, 3}});
  const auto stats = data::channel_statistics(set);
  const data::MappedDataset normalized(set, {data::normalize(stats.mean, stats.stddev)});
  const auto after = data::channel_statistics(normalized);
  for (int c = 0; c < 3; ++c) {
    CHECK(after.mean[c] == Approx(0.0).margin(1e-4));
    CHECK(after.stddev[c] == Approx(1.0).epsilon(1e-3));
  }
  CHECK_THROWS_AS(data::normalize({0.5f}, {0.0f}), InvalidArgument);
}

TEST_CASE("byte batches expanded by expand_images equal the host transforms bit for bit", "[data]") {
  const auto set = data::make_synthetic({.samples = 37, .sample_shape = {6, 5, 3}, .classes = 4, .seed = 9});
  const std::vector<data::ImageAugmentation> augmentations{
      {.crop_padding = 2, .flip_horizontal = true, .mean = {0.3f, 0.5f, 0.7f}, .stddev = {0.2f, 0.25f, 0.3f}},
      {.crop_padding = 7},  // wider than the image: some samples are all padding
      {.flip_horizontal = true},
      {.mean = {0.45f, 0.5f, 0.55f}, .stddev = {0.7f, 0.3f, 0.1f}},
      {}};
  for (std::size_t a = 0; a < augmentations.size(); ++a) {
    const data::ImageAugmentation& augmentation = augmentations[a];
    const data::ImageExpander expand(augmentation, 3, Device::CPU);
    const Tensor stored = data::stored_images(set, Device::CPU);
    std::set<std::vector<std::int32_t>> draws_seen;
    for (int replica = 0; replica < 2; ++replica) {
      INFO("augmentation " << a << ", replica " << replica);
      const data::DataLoader host(set, {.batch_size = 8, .seed = 3, .transforms = data::transforms_of(augmentation),
                                        .replica = replica, .replicas = 2});
      const data::DataLoader bytes(set, {.batch_size = 8, .seed = 3, .replica = replica, .replicas = 2,
                                         .byte_images = augmentation});
      const data::DataLoader indices(set, {.batch_size = 8, .seed = 3, .replica = replica, .replicas = 2,
                                           .byte_images = augmentation, .sample_indices_only = true});
      for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
        auto host_epoch = host.epoch(epoch);
        auto byte_epoch = bytes.epoch(epoch);
        auto index_epoch = indices.epoch(epoch);
        while (auto expected = host_epoch->next()) {
          const auto batch = byte_epoch->next();
          const auto indexed = index_epoch->next();
          REQUIRE(batch);
          REQUIRE(indexed);
          REQUIRE(batch->images.dtype() == DType::UInt8);
          REQUIRE(batch->draws.shape() == Shape({expected->images.dim(0), 3}));
          CHECK_FALSE(indexed->images.defined());
          CHECK(batch->labels.to_vector() == expected->labels.to_vector());
          CHECK(indexed->labels.to_vector() == expected->labels.to_vector());
          CHECK(expand(batch->images, {}, batch->draws).to_vector() == expected->images.to_vector());
          CHECK(expand(stored, indexed->indices, indexed->draws).to_vector() == expected->images.to_vector());
          for (std::int64_t i = 0; i < batch->draws.dim(0); ++i) {
            const std::int32_t* d = batch->draws.data<std::int32_t>() + i * 3;
            draws_seen.insert({d[0], d[1], d[2]});
          }
        }
        CHECK_FALSE(byte_epoch->next());
      }
    }
    // The draws are what the augmentation asks for: shifts within the padding, flips both ways.
    const int padding = augmentation.crop_padding;
    for (const auto& d : draws_seen) {
      CHECK(std::abs(d[0]) <= padding);
      CHECK(std::abs(d[1]) <= padding);
      CHECK((d[2] == 0 || augmentation.flip_horizontal));
    }
    if (augmentation.flip_horizontal) {
      CHECK(std::any_of(draws_seen.begin(), draws_seen.end(), [](const auto& d) { return d[2] == 1; }));
      CHECK(std::any_of(draws_seen.begin(), draws_seen.end(), [](const auto& d) { return d[2] == 0; }));
    }
    if (padding > 0) CHECK(std::any_of(draws_seen.begin(), draws_seen.end(), [](const auto& d) { return d[0] != 0; }));
  }
}

TEST_CASE("expand_images shifts with zeros and mirrors as described", "[data][ops]") {
  // One 2x3 image of one channel, shifted down-right by (1, 1) and mirrored: out[y][x] = in[y + 1][(2 - x) + 1].
  const Tensor bytes({1, 2, 3, 1}, DType::UInt8);
  const std::vector<std::uint8_t> pixels{0, 51, 102, 153, 204, 255};
  std::copy(pixels.begin(), pixels.end(), bytes.data<std::uint8_t>());
  const Tensor draws = Tensor::from_values({1, 3}, std::vector<std::int32_t>{1, 1, 1});
  const Tensor out({1, 2, 3, 1});
  ops::expand_images(bytes, {}, draws, Tensor::from_values({1}, std::vector<float>{0.0f}),
                     Tensor::from_values({1}, std::vector<float>{1.0f}), out);
  // Row 0 reads source row 1 at columns 3, 2, 1: outside, 255, 204; row 1 reads row 2: outside.
  CHECK(out.to_vector() == std::vector<float>{0.0f, 255 * (1.0f / 255.0f), 204 * (1.0f / 255.0f), 0.0f, 0.0f, 0.0f});
}

TEST_CASE("byte batches refuse unsuitable data sets, transforms beside them and malformed operands by name", "[data]") {
  const auto set = data::make_synthetic({.samples = 16, .sample_shape = {4, 4, 3}});
  const data::MappedDataset floats(set, {data::random_flip_horizontal()});
  CHECK_THROWS_WITH(data::DataLoader(floats, {.byte_images = data::ImageAugmentation{}}),
                    Catch::Contains("gives its class-labelled samples as 8-bit values") &&
                        Catch::Contains(floats.description()));
  CHECK_THROWS_WITH(data::DataLoader(set, {.transforms = {data::random_flip_horizontal()},
                                           .byte_images = data::ImageAugmentation{}}),
                    Catch::Contains("host transforms both given"));
  CHECK_THROWS_WITH(data::DataLoader(set, {.byte_images = data::ImageAugmentation{.crop_padding = -1}}),
                    Catch::Contains("padding must be >= 0"));
  std::mt19937_64 rng(1);
  CHECK_THROWS_WITH(data::draw({.crop_padding = -2}, rng), Catch::Contains("padding must be >= 0, got -2"));
  CHECK_THROWS_WITH(data::ImageExpander({.mean = {0.5f}, .stddev = {0.5f}}, 3, Device::CPU),
                    Catch::Contains("normalizes 1 channels, the images have 3"));
  CHECK_THROWS_WITH(data::ImageExpander({.mean = {0.5f, 0.5f, 0.5f}}, 3, Device::CPU),
                    Catch::Contains("one mean and one stddev per channel"));
  CHECK_THROWS_WITH(floats.load_bytes(0, nullptr), Catch::Contains("does not store 8-bit samples"));

  const Tensor mean({3}), stddev = Tensor::full({3}, 1.0f), draws({2, 3}, DType::Int32);
  const Tensor out({2, 4, 4, 3});
  CHECK_THROWS_WITH(ops::expand_images(Tensor({2, 4, 4, 3}), {}, draws, mean, stddev, out),
                    Catch::Contains("expand_images: takes uint8 images") && Catch::Contains("float32 (2, 4, 4, 3)"));
  const Tensor bytes({2, 4, 4, 3}, DType::UInt8);
  CHECK_THROWS_WITH(ops::expand_images(bytes, {}, Tensor({2, 2}, DType::Int32), mean, stddev, out),
                    Catch::Contains("draws (N, 3)"));
  CHECK_THROWS_WITH(ops::expand_images(bytes, {}, draws, Tensor({4}), Tensor::full({4}, 1.0f), out),
                    Catch::Contains("mean and stddev (C)"));
  CHECK_NOTHROW(ops::expand_images(bytes, {}, draws, mean, stddev, out));
  // Samples taken by index from a larger set: the indices must name its images.
  const Tensor set_of_five({5, 4, 4, 3}, DType::UInt8);
  CHECK_NOTHROW(ops::expand_images(set_of_five, Tensor::from_values({2}, std::vector<std::int32_t>{4, 0}), draws, mean,
                                   stddev, out));
  CHECK_THROWS_WITH(ops::expand_images(set_of_five, Tensor::from_values({2}, std::vector<std::int32_t>{1, 5}), draws,
                                       mean, stddev, out),
                    Catch::Contains("index 5 of sample 1 is outside the 5 images"));
  CHECK_THROWS_WITH(ops::expand_images(set_of_five, Tensor({2}), draws, mean, stddev, out),
                    Catch::Contains("int32 indices"));
  CHECK_THROWS_WITH(ops::expand_images(set_of_five, {}, draws, mean, stddev, out), Catch::Contains("or none (S = N)"));
  CHECK_THROWS_WITH(data::DataLoader(set, {.sample_indices_only = true}), Catch::Contains("byte_images unset"));
}
