// A build without NCCL: GPU gradients always travel through pinned host buffers.
#include "cohort/comm/nccl.hpp"

namespace cohort::comm {

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, std::string& why_not) {
  why_not = "this build of cohort has no NCCL (configure with CUDA and NCCL present)";
  return nullptr;
}

}  // namespace cohort::comm
