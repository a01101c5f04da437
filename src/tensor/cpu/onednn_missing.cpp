// A build without oneDNN: bfloat16 always computes through float32 stand-ins, so no kernel here is reached.
#include "cohort/core/check.hpp"
#include "onednn.hpp"

namespace cohort::cpu::onednn {

namespace {
constexpr const char* kMissing = "this build has no oneDNN (libdnnl-dev)";
}

Bf16Kernels bf16_kernels() { return Bf16Kernels::Float32StandIns; }

void set_bf16_kernels(Bf16Kernels kernels) {
  COHORT_CHECK(kernels == Bf16Kernels::Float32StandIns, "the bfloat16 kernels cannot run: {}", kMissing);
}

std::string bf16_kernels_description() { return std::string("float32 stand-ins: ") + kMissing; }

bool float32_forward_convolutions() { return false; }

void set_float32_forward_convolutions(bool on) {
  COHORT_CHECK(!on, "float32 convolutions cannot run on oneDNN: {}", kMissing);
}

std::string float32_forward_convolutions_description() { return std::string("the backend's own: ") + kMissing; }

struct Convolution::Primitives {};
Convolution::Convolution() = default;
Convolution::~Convolution() = default;

void Convolution::forward(const Conv2dGeometry&, const Tensor&, const Tensor&, const Tensor&, Activation, const Tensor&) {
  throw InvalidArgument(kMissing);
}

void Convolution::backward(const Conv2dGeometry&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&) {
  throw InvalidArgument(kMissing);
}

void matmul(const Tensor&, bool, const Tensor&, bool, const Tensor&, float, float) { throw InvalidArgument(kMissing); }

}  // namespace cohort::cpu::onednn
