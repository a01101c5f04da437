#pragma once
// DataLoader: turns a Dataset into batches (images (N, ...sample_shape), labels (N) or (N, ...target_shape)) in the order of a
// Sampler, applying transforms, with a background thread that prepares the next batches while the
// current one trains. An exception in the producer is rethrown by next(); destroying an epoch stops
// its thread promptly.
//
//   data::DataLoader loader(train, {.batch_size = 128, .seed = 1});
//   auto epoch = loader.epoch(0);
//   while (auto batch = epoch.next()) model.forward(batch->images);

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/data/image_augmentation.hpp"
#include "cohort/data/sampler.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::data {

struct LoaderOptions {
  std::int64_t batch_size = 32;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_remainder = false;  // drop a final partial batch
  std::vector<Transform> transforms;
  int prefetch = 2;  // batches prepared ahead; 0 prepares on the calling thread
  // Data-parallel training: `replicas` processes share one pass over the sampler's order per epoch. Global
  // step k consumes the next replicas x batch_size samples of the order; replica r takes the r-th
  // batch_size of them. Every replica sees the same number of batches per epoch; at the tail of an epoch
  // some get a short or an empty batch, so that no sample is dropped or seen twice.
  int replica = 0;
  int replicas = 1;
  // Batches in page-locked host memory, the fast source of copies to a GPU.
  bool pinned = false;
  // Images as the data set stores them (uint8) with each sample's draws of this augmentation, for the
  // device to expand (ImageExpander): a data set of 8-bit, class-labelled samples, and no `transforms`.
  std::optional<ImageAugmentation> byte_images;
  // With byte_images: batches carry each sample's index in the data set (Batch::indices) and no images, for
  // a caller that keeps them all on its device (stored_images()).
  bool sample_indices_only = false;
};

struct Batch {
  Tensor images;
  Tensor labels;
  std::int64_t index = 0;  // position within the epoch
  Tensor draws;            // with LoaderOptions::byte_images: int32 (N, 3), each sample's (dy, dx, flip)
  Tensor indices;          // with LoaderOptions::sample_indices_only: int32 (N), in place of the images
};

class DataLoader {
 public:
  // The sampler defaults to a ShuffleSampler (options.shuffle) or a SequentialSampler.
  DataLoader(const Dataset& dataset, LoaderOptions options, std::shared_ptr<const Sampler> sampler = nullptr);

  class Epoch {
   public:
    ~Epoch();
    Epoch(const Epoch&) = delete;
    Epoch& operator=(const Epoch&) = delete;
    Epoch(Epoch&&) = delete;
    // The next batch, or nothing at the end of the epoch.
    std::optional<Batch> next();

   private:
    friend class DataLoader;
    Epoch(const DataLoader& loader, std::int64_t epoch, std::int64_t first_batch);
    void produce();

    const DataLoader& loader_;
    std::int64_t epoch_;
    std::vector<std::int64_t> order_;
    std::int64_t next_to_produce_, next_to_return_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Batch> ready_;
    std::exception_ptr failure_;
    bool stopping_ = false;
    std::thread producer_;
  };

  // Iterates epoch `epoch`, starting at batch `first_batch` (to resume mid-epoch).
  std::unique_ptr<Epoch> epoch(std::int64_t epoch, std::int64_t first_batch = 0) const;

  // Batches per epoch, the same for every replica.
  std::int64_t batches_per_epoch() const;
  // Samples per epoch across all replicas.
  std::int64_t samples_per_epoch() const;
  const Dataset& dataset() const { return dataset_; }
  const LoaderOptions& options() const { return options_; }

  // Assembles batch `batch_index` of an epoch with the given order (exposed for tests and benchmarks).
  Batch make_batch(const std::vector<std::int64_t>& order, std::int64_t epoch, std::int64_t batch_index) const;

 private:
  // A host tensor, pinned where the options say.
  Tensor host_tensor(Shape shape, DType type = DType::Float32) const;
  // The batch of these samples with byte_images: their bytes (or indices), labels and draws.
  Batch make_byte_batch(std::span<const std::int64_t> samples, std::uint64_t epoch_seed, std::int64_t batch_index) const;

  const Dataset& dataset_;
  LoaderOptions options_;
  std::shared_ptr<const Sampler> sampler_;
  std::int64_t order_size_;
};

}  // namespace cohort::data
