#pragma once
// Checkpoints: the model's variables, the optimizer's state, the model's step counter (which seeds
// dropout), the data seed, the position in training and the CPU's GEMM path, in one file. The file starts with a magic, a
// format version, the payload size and a CRC-32 of the payload; it is written to a temporary file,
// flushed and renamed, so a crash leaves either the old or the new checkpoint. Loading a damaged,
// foreign or mismatched file raises DataError and changes nothing.
//
//   train::save_checkpoint("run/latest.ckpt", model, optimizer, position);
//   auto position = train::load_checkpoint("run/latest.ckpt", model, optimizer);

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/nn/sequential.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/train/history.hpp"

namespace cohort::train {

struct TrainingPosition {
  std::int64_t epoch = 0;           // epoch to continue in
  std::int64_t batch_in_epoch = 0;  // first batch of that epoch not yet trained
  std::int64_t global_step = 0;     // optimizer steps taken
  std::uint64_t data_seed = 0;
  History history{};                // completed epochs
  double learning_rate_factor = 1;  // what callbacks made of the optimizer's schedule
  // The CPU's matrix products ("eigen", "openblas"; empty where unknown): a resumed run computes them as the
  // interrupted one did, since the two libraries round differently.
  std::string gemm_path{};
  // The instruction set of the CPU's convolution kernels ("avx2"; empty where unknown), for the same reason.
  std::string cpu_isa{};
  // mixed_float16's dynamic loss scale and its finite steps since it last changed (0: no loss scaling).
  float loss_scale = 0;
  std::int64_t loss_scale_finite_steps = 0;
  std::string precision{};  // the model's policy ("mixed_bfloat16"; empty where unknown)
};

// The checkpoint in a run's checkpoint directory.
inline constexpr const char* kCheckpointFile = "latest.ckpt";

inline constexpr std::uint32_t kCheckpointFormatVersion = 6;  // 6: optimizer shards

// With `optimizer_shards` (files beside `path`, written first by each rank of a sharded update), the
// checkpoint names them and keeps only the optimizer's kind and iteration count itself.
void save_checkpoint(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                     const TrainingPosition& position, const std::vector<std::string>& optimizer_shards = {});
// Restores into `model` and `optimizer`, which must have the same variables (names and shapes). The state
// of a sharded update is assembled whole from its shards, so any strategy on any process count resumes it.
TrainingPosition load_checkpoint(const std::filesystem::path& path, nn::Sequential& model, optim::Optimizer& optimizer);

}  // namespace cohort::train
