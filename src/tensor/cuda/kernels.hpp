#pragma once
// Launchers of the CUDA backend's own kernels (kernels.cu): everything cuBLAS and cuDNN do not compute.
// Each enqueues on the given stream and returns at once; sizes are element counts. The semantics are the
// CPU backend's, operation for operation (windows clipped to the input, the first maximum takes a
// pooling gradient, biased batch variance, statistics accumulated in double, the same dropout generator),
// so that the two devices agree to rounding (the kernels are built without FMA contraction, as the CPU's
// code is). Reductions write per-block partial sums that a second pass combines in a fixed order, in
// double: results do not depend on scheduling (the CPU's bias gradient sums in float, so there the GPU is
// the more exact of the two).
//
// Launchers templated on `T` take any element type of a layer's activations: float, __nv_bfloat16 or __half
// (kernels.cu instantiates those). They read 16-bit values as float, compute in float and round once to
// nearest even where they store, as the CPU's float32 stand-ins do; per-channel parameters and statistics
// stay float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cohort/tensor/geometry.hpp"
#include "tensor/dropout_rule.hpp"
#include "tensor/image_expansion.hpp"

namespace cohort::cuda::kernels {

// ---- element types: float32 to a 16-bit type rounds to nearest even (NaN, infinity and subnormals kept);
// back is exact.
enum class HalfType { BFloat16, Float16 };
void narrow(const float* from, std::uint16_t* to, std::int64_t n, HalfType type, cudaStream_t stream);
void widen(const std::uint16_t* from, float* to, std::int64_t n, HalfType type, cudaStream_t stream);
void int_to_float(const std::int32_t* from, float* to, std::int64_t n, cudaStream_t stream);

// ---- elementwise
void fill(float* x, std::int64_t n, float value, cudaStream_t stream);
void axpy(float alpha, const float* x, float* y, std::int64_t n, cudaStream_t stream);
void scale(float* x, std::int64_t n, float alpha, cudaStream_t stream);
template <class T>
void multiply(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream);
void moving_average(float* moving, const float* batch, std::int64_t n, float momentum, cudaStream_t stream);

// Sum of x (or of x * x) in per-block partials; returns how many partials it wrote (at most kMaxPartials).
constexpr int kMaxPartials = 1024;
int partial_sums(const float* x, std::int64_t n, bool squares, double* partials, cudaStream_t stream);

// ---- rows (width = the last axis). A bias is float or of y's type. Softmax takes float only.
// y = activation(y + bias) in one pass, an elementwise activation (Linear: the bias alone).
template <class T, class Bias>
void bias_activation(T* y, const Bias* bias, Activation activation, std::int64_t rows, std::int64_t width,
                     cudaStream_t stream);
template <class T>
void activation_forward(Activation activation, const T* x, T* y, std::int64_t n, std::int64_t width,
                        cudaStream_t stream);
template <class T>
void activation_backward(Activation activation, const T* y, const T* dy, T* dx, std::int64_t n, std::int64_t width,
                         cudaStream_t stream);

// ---- per-channel sums over the rows of an (rows x channels) view, in double, in two passes.
// What is summed per element: for kValues (a) and a * a; for kGradients dy and dy * (x - mean) * inv_std,
// where dy is a, or, after an activation fused into the forward pass, a through that activation's gradient.
enum class ChannelTerms { kValues, kGradients };
template <class T>
struct ChannelSums {
  ChannelTerms terms = ChannelTerms::kValues;
  const T* a = nullptr;            // the values, or dy
  const T* x = nullptr;            // kGradients: the forward input
  const float* mean = nullptr;     // kGradients: per channel
  const float* inv_std = nullptr;  // kGradients: per channel
  std::int64_t rows = 0, channels = 0;
  const T* activated = nullptr;    // kGradients: the fused activation's output, or null for none
  Activation activation = Activation::Linear;
};
// Doubles of scratch the sums need (partials of both terms).
std::int64_t channel_sums_scratch(std::int64_t rows, std::int64_t channels);
// Sums into first[c] and second[c] (either may be null), as floats.
template <class T>
void channel_sums(const ChannelSums<T>& sums, double* scratch, float* first, float* second, cudaStream_t stream);

// ---- batch normalization pieces: statistics from the sums, the normalization and the data gradients
// mean = sum / rows, variance = max(sum_squares / rows - mean^2, 0), from double sums (channel_sums scratch).
template <class T>
void batch_statistics(const T* x, std::int64_t rows, std::int64_t channels, double* scratch, float* mean,
                      float* variance, cudaStream_t stream);
void inverse_std(const float* variance, float epsilon, float* inv_std, std::int64_t channels, cudaStream_t stream);
// y = activation(x * multiplier + (beta - mean * multiplier)), multiplier = gamma / sqrt(variance + epsilon)
template <class T>
void batch_norm_normalize(const T* x, const float* mean, const float* variance, float epsilon, const float* gamma,
                          const float* beta, Activation activation, T* y, std::int64_t rows, std::int64_t channels,
                          cudaStream_t stream);
// Training: dx = gamma * inv_std * (g - dbeta / M - (x - mean) * inv_std * dgamma / M), with g = dy, or dy
// through the gradient of the activation whose output `activated` is (when not null).
template <class T>
void batch_norm_data_gradient(const T* x, const T* dy, const T* activated, Activation activation, const float* mean,
                              const float* inv_std, const float* gamma, const float* dbeta, const float* dgamma, T* dx,
                              std::int64_t rows, std::int64_t channels, cudaStream_t stream);
// Inference: dx = dy * gamma * inv_std
template <class T>
void batch_norm_data_gradient_inference(const T* dy, const float* inv_std, const float* gamma, T* dx,
                                        std::int64_t rows, std::int64_t channels, cudaStream_t stream);

// ---- pooling
template <class T>
void pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, cudaStream_t stream);
template <class T>
void pool2d_backward(const Pool2dGeometry& g, const T* x, const T* y, const T* dy, T* dx, cudaStream_t stream);

// ---- convolution layout helpers: HWIO (Keras) <-> OHWI (cuDNN's NHWC filter), and explicit padding for
// the asymmetric padding cuDNN cannot express. A 16-bit kernel's gradient leaves cuDNN in its 16-bit type and
// is widened to float on its way back to HWIO.
template <class T>
void hwio_to_ohwi(const T* hwio, T* ohwi, std::int64_t taps, std::int64_t in_c, std::int64_t out_c, cudaStream_t stream);
template <class From>
void ohwi_to_hwio(const From* ohwi, float* hwio, std::int64_t taps, std::int64_t in_c, std::int64_t out_c,
                  cudaStream_t stream);
struct PaddedImage {
  std::int64_t batch, in_h, in_w, channels, padded_h, padded_w, pad_top, pad_left;
};
template <class T>
void pad_images(const PaddedImage& p, const T* x, T* padded, cudaStream_t stream);
template <class T>
void crop_images(const PaddedImage& p, const T* padded, T* x, cudaStream_t stream);

// ---- dropout: the CPU backend's counter-based generator, element for element
// `step` null: the rule's own key; else the key of derive_seed(seed, *step), read on the device.
template <class T>
void dropout_mask(T* mask, std::int64_t n, const DropoutRule& rule, std::uint64_t seed, const std::uint64_t* step,
                  cudaStream_t stream);
// The low `bytes` (4 or 8) of `bits` into `destination`, as a kernel's argument.
void write_bits(void* destination, std::uint64_t bits, int bytes, cudaStream_t stream);

// ---- 8-bit images to float32, each sample shifted, mirrored and normalized as its draws (N, 3) say; sample n
// reads image indices[n] of the `stored` ones (zeros outside them), or image n where indices is null
void expand_images(const ImageExpansion& expansion, std::int64_t batch, const std::uint8_t* images, std::int64_t stored,
                   const std::int32_t* indices, const std::int32_t* draws, const float* mean, const float* stddev,
                   float* out, cudaStream_t stream);

// ---- optimizer updates (the CPU backend's formulas) of up to kMaxTensorsPerLaunch variables in one
// launch, passed by value as kernel parameters; the step size is read on the device. operand[k][t] is operand k of variable t: the value, the
// gradient, then the slots in the order of the optimizer's ops:: operands (null where unused).
constexpr int kMaxTensorsPerLaunch = 32;
struct TensorList {
  float* operand[5][kMaxTensorsPerLaunch] = {};
  std::int64_t size[kMaxTensorsPerLaunch] = {};
  int count = 0;
};
void sgd_update(const TensorList& variables, const float* step_size, float momentum, bool nesterov, float weight_decay,
                cudaStream_t stream);
void adam_update(const TensorList& variables, const float* step_size, float beta_1, float beta_2, float epsilon,
                 float weight_decay, cudaStream_t stream);
void rmsprop_update(const TensorList& variables, const float* step_size, float rho, float momentum, float epsilon,
                    float weight_decay, cudaStream_t stream);

// ---- losses and metrics, one thread per row. labels: class indices (sparse) or (rows x classes)
// targets. row_values[r] receives the row's loss (or 1.0 when its arg-max is right); bad_row receives the
// smallest row whose sparse label is not a class index (must hold all bits set before the call).
struct LossRows {
  const float* scores = nullptr;
  const float* labels = nullptr;
  bool sparse = false;
  std::int64_t rows = 0, classes = 0;
  double* row_values = nullptr;
  unsigned long long* bad_row = nullptr;
};
void softmax_cross_entropy(const LossRows& rows, float* dlogits, cudaStream_t stream);
void categorical_cross_entropy(const LossRows& rows, float* dprobabilities, cudaStream_t stream);
void count_correct(const LossRows& rows, cudaStream_t stream);
// row_values[r] receives 1.0 when the row's label is among its k highest scores.
void count_top_k(const LossRows& rows, int k, cudaStream_t stream);
// Element-wise losses (loss_rules.hpp): `classes` counts a row's outputs and `labels` holds one target per
// output. row_values[r] receives the mean over the row's outputs, `gradient` (unless null) the derivative of
// the mean over every output.
void elementwise_loss(ElementwiseLoss loss, const LossRows& rows, float* gradient, cudaStream_t stream);
// Adds the rows' values to *sum in a fixed order; records the first bad label (row + 1, value, classes) in
// bad_label unless one is recorded already.
void add_rows(const LossRows& rows, double* sum, double* bad_label, cudaStream_t stream);

}  // namespace cohort::cuda::kernels
