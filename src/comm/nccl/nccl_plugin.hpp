#pragma once
// The NCCL communicator lives in libcohort_nccl.so (core/plugin.hpp), so that libcohort needs neither NCCL
// nor the CUDA runtime: its table of entry points. The ranks' agreement on whether to use NCCL is made in
// libcohort (nccl.cpp), so that a rank where the part cannot be loaded still takes part in it.
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>

#include "cohort/comm/communicator.hpp"
#include "core/plugin.hpp"

namespace cohort::comm {

inline constexpr int kNcclPluginLayout = 3;  // 2: Communicator::reduce_scatter; 3: Buffer::ready

struct NcclPlugin {
  using Uuid = std::array<char, 16>;
  static constexpr std::size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)

  PluginHeader header;
  // The UUID of CUDA device `gpu`, which tells whether two ranks share one.
  Uuid (*gpu_uuid)(int gpu);
  // On rank 0: the id every rank then creates its communicator with (kUniqueIdBytes).
  void (*make_unique_id)(std::span<std::byte> id);
  // Collective over the ranks that got the same id.
  std::unique_ptr<Communicator> (*make_communicator)(int rank, int size, int gpu, std::span<const std::byte> id,
                                                     std::chrono::milliseconds timeout);
};

}  // namespace cohort::comm
