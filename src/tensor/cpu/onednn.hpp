#pragma once
// The CPU backend's kernels through oneDNN: bfloat16 convolutions and matrix products where the processor
// multiplies bfloat16 itself (AVX-512 BF16, AMX-BF16), accumulating in float32, and float32 convolutions
// forward where oneDNN's outrun the backend's own (float32_forward_convolutions()). Batch normalization, max
// pooling, elementwise activations and products are the backend's own loops reading and writing bfloat16
// (elements.hpp). Elsewhere, and for float16, the op layer computes through float32 stand-ins instead. Built
// when oneDNN is found (Debian libdnnl-dev); a build without it never has these kernels (onednn_missing.cpp).
//
// Which kernels run is chosen once: COHORT_BF16_KERNELS=native|float32 when set, else native where oneDNN's
// bfloat16 convolution runs on a bfloat16 instruction set; COHORT_CPU_ISA=avx2 or portable turns it off, as
// it turns off the AVX-512 Winograd kernels. set_bf16_kernels() switches in tests.
#include <memory>
#include <string>

#include "cohort/tensor/geometry.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::cpu::onednn {

enum class Bf16Kernels { Float32StandIns, Native };

// The kernels bfloat16 operands run through; the first call decides and logs the choice with the reason.
Bf16Kernels bf16_kernels();
// InvalidArgument when `kernels` cannot run here, naming why.
void set_bf16_kernels(Bf16Kernels kernels);
// What bfloat16 computes with here, for reports: "native (oneDNN on AMX-BF16)", or why it is computed in
// float32 ("float32 stand-ins: this processor has no bfloat16 instructions ...").
std::string bf16_kernels_description();

// Whether float32 convolutions run forward on oneDNN: on Intel processors with AVX-512, whose two 512-bit FMA
// units run oneDNN's float32 brgconv faster than the backend's Winograd and im2col kernels. Measured on a
// Sapphire Rapids core: the flagship's inference at batch 128 on 2 threads in 22 ms against 25, one image on
// one thread in 0.53 ms against 0.69 (its float32 kernels are the same whether oneDNN may use AMX or not). On
// AMD's AVX-512 (Zen 4) the backend's own kernels ran the flagship 1.6-1.8x as fast as PyTorch on oneDNN, so
// they stay there. Not where COHORT_CPU_ISA keeps to an instruction set below avx512 or ONEDNN_MAX_CPU_ISA
// below AVX-512. Decided on first use and logged.
bool float32_forward_convolutions();
// Switches it in tests; InvalidArgument when `on` cannot run here, naming why.
void set_float32_forward_convolutions(bool on);
// What float32 convolutions compute forward with here, for reports.
std::string float32_forward_convolutions_description();

// The oneDNN primitives of one convolution geometry, made for each batch size, activation and operand types
// on first use and kept.
class Convolution {
 public:
  Convolution();
  ~Convolution();
  Convolution(const Convolution&) = delete;
  Convolution& operator=(const Convolution&) = delete;

  // y = activation(conv(x, kernel) + bias); x, kernel and y bfloat16, bias bfloat16 or float32 (or undefined);
  // or every operand float32.
  void forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation,
               const Tensor& y);
  // dx (bfloat16, when defined) and the float32 dkernel and dbias (when defined) from bfloat16 x, kernel, dy.
  void backward(const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel, const Tensor& dy, const Tensor& dx,
                const Tensor& dkernel, const Tensor& dbias);

 private:
  void kernel_gradient_from_products(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy, const Tensor& dkernel,
                                     const Tensor& dbias);

  struct Primitives;
  std::unique_ptr<Primitives> primitives_;
};

// c = alpha * op(a) * op(b) + beta * c with bfloat16 a and b, c bfloat16 or float32.
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha, float beta);

}  // namespace cohort::cpu::onednn
