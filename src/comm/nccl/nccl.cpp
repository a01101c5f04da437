// The NCCL communicator's part, libcohort_nccl.so, loaded when a strategy first asks for NCCL, and the
// ranks' agreement on whether to use it: made here, over the host communicator, so that a rank where the
// part cannot be loaded still takes part and every rank reaches the same verdict.
#include "cohort/comm/nccl.hpp"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <vector>

#include "cohort/core/check.hpp"
#include "cohort/core/config.hpp"
#include "nccl_plugin.hpp"

namespace cohort::comm {
namespace {

const NcclPlugin* nccl_plugin(std::string& why_not) {
  static const LoadedPlugin loaded =
      load_plugin({"libcohort_nccl.so", "cohort_nccl_plugin", "the NCCL communicator", "cohort-cuda", kNcclPluginLayout, false,
                   COHORT_HAS_NCCL ? nullptr : "this build of cohort has no NCCL (configure with CUDA and NCCL present)"});
  return table_of<NcclPlugin>(loaded, why_not);
}

// What each rank tells the others before NCCL is set up: whether it uses a GPU, which (its UUID), and
// whether it could load NCCL. Sent as floats whose bit patterns the host collectives copy unchanged.
struct GpuIdentity {
  std::uint32_t uses_gpu;
  std::uint32_t has_nccl;
  NcclPlugin::Uuid uuid;
};
constexpr std::size_t kIdentityFloats = (sizeof(GpuIdentity) + sizeof(float) - 1) / sizeof(float);
constexpr std::size_t kIdFloats = NcclPlugin::kUniqueIdBytes / sizeof(float);

// Why the ranks cannot use NCCL, the same words on every rank except the one whose own reason is known.
std::string why_not_nccl(const std::vector<GpuIdentity>& identities, int me, const std::string& my_reason) {
  std::set<std::string> seen;
  for (std::size_t rank = 0; rank < identities.size(); ++rank) {
    if (!identities[rank].uses_gpu) return fmt::format("rank {} does not train on a GPU", rank);
    if (!identities[rank].has_nccl)
      return fmt::format("rank {} cannot load the NCCL communicator{}", rank,
                         static_cast<int>(rank) == me ? ": " + my_reason : std::string());
    const std::string uuid(identities[rank].uuid.data(), identities[rank].uuid.size());
    if (!seen.insert(uuid).second) return fmt::format("rank {} shares its GPU with another rank", rank);
  }
  return {};
}

}  // namespace

bool nccl_available() { return COHORT_HAS_NCCL; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int gpu, std::string& why_not) {
  COHORT_CHECK(bootstrap.accepts(Device::CPU), "NCCL is set up over a host communicator, not '{}'", bootstrap.name());
  if (!nccl_available()) {  // the same on every rank of one build: no agreement needed
    nccl_plugin(why_not);   // which says so
    return nullptr;
  }
  std::string my_reason;
  // Only a rank on a GPU loads NCCL: a CPU rank's verdict is known without it.
  const NcclPlugin* plugin = gpu >= 0 ? nccl_plugin(my_reason) : nullptr;
  GpuIdentity mine{};
  mine.uses_gpu = gpu >= 0;
  mine.has_nccl = plugin != nullptr;
  if (plugin != nullptr) mine.uuid = plugin->gpu_uuid(gpu);
  const int size = bootstrap.size();
  std::vector<float> packed(kIdentityFloats, 0.0f), all(kIdentityFloats * static_cast<std::size_t>(size), 0.0f);
  std::memcpy(packed.data(), &mine, sizeof mine);
  bootstrap.allgather(Buffer::of(packed), Buffer::of(all))->wait(bootstrap.timeout());
  std::vector<GpuIdentity> identities(static_cast<std::size_t>(size));
  for (std::size_t rank = 0; rank < identities.size(); ++rank)
    std::memcpy(&identities[rank], all.data() + rank * kIdentityFloats, sizeof(GpuIdentity));
  why_not = why_not_nccl(identities, bootstrap.rank(), my_reason);
  if (!why_not.empty()) return nullptr;

  std::vector<float> id(kIdFloats, 0.0f);
  if (bootstrap.rank() == 0) plugin->make_unique_id(std::as_writable_bytes(std::span(id)));
  bootstrap.broadcast(Buffer::of(id), 0)->wait(bootstrap.timeout());
  return plugin->make_communicator(bootstrap.rank(), size, gpu, std::as_bytes(std::span(id)), bootstrap.timeout());
}

}  // namespace cohort::comm
