// bfloat16 convolutions and matrix products through oneDNN (see onednn.hpp). The tensors' own memory is
// handed to oneDNN as NHWC activations and HWIO kernels, which oneDNN's "nhwc" and "hwio" tags describe
// exactly; a primitive may want its weights in a blocked layout of its own, so the kernel (or the kernel
// gradient) is reordered per call, one pass over a small tensor. Primitives are made once per shape.
#include "onednn.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/settings.hpp"
#include "tensor/backend_access.hpp"

namespace cohort::cpu::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

memory::data_type data_type(DType type) {
  switch (type) {
    case DType::BFloat16: return memory::data_type::bf16;
    case DType::Float16: return memory::data_type::f16;
    case DType::Int32: return memory::data_type::s32;
    case DType::Float32: break;
  }
  return memory::data_type::f32;
}

memory wrap(const memory::desc& desc, const Tensor& t) { return memory(desc, engine(), device_bytes(t)); }

// Why oneDNN cannot compute bfloat16 itself here; empty when it can.
std::string why_not_native() {
  if (const auto isa = choice_setting("COHORT_CPU_ISA", kCpuIsaSpellings); isa && *isa != "avx512")
    return fmt::format("COHORT_CPU_ISA={} keeps to instructions without bfloat16", *isa);
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (isa != dnnl::cpu_isa::avx512_core_bf16 && isa != dnnl::cpu_isa::avx512_core_amx)
    return "this processor has no bfloat16 instructions (AVX-512 BF16 or AMX)";
  return {};
}

struct Choice {
  Bf16Kernels kernels;
  std::string description;
};

std::mutex choice_mutex;
std::optional<Choice> chosen;

// `asker` names who wants them, for the refusal: the setting, or the program.
Choice choose(std::optional<Bf16Kernels> wanted, std::string_view asker) {
  const std::string why_not = why_not_native();
  if (wanted == Bf16Kernels::Native && !why_not.empty())
    throw InvalidArgument(fmt::format("the bfloat16 kernels cannot run: {} ({})", why_not, asker));
  if (wanted == Bf16Kernels::Float32StandIns) return {*wanted, "float32 stand-ins (chosen)"};
  if (!why_not.empty()) return {Bf16Kernels::Float32StandIns, "float32 stand-ins: " + why_not};
  const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  return {Bf16Kernels::Native, fmt::format("native (oneDNN on {})", amx ? "AMX-BF16" : "AVX-512 BF16")};
}

// The choice, made on first use from COHORT_BF16_KERNELS.
const Choice& choice() {
  const std::lock_guard lock(choice_mutex);
  if (!chosen) {
    const auto setting = choice_setting("COHORT_BF16_KERNELS", kBf16KernelsSpellings);
    std::optional<Bf16Kernels> wanted;
    if (setting) wanted = *setting == "native" ? Bf16Kernels::Native : Bf16Kernels::Float32StandIns;
    chosen = choose(wanted, "COHORT_BF16_KERNELS=native asks for them: unset it, or set float32");
    log::debug("bfloat16 kernels: {}", chosen->description);
  }
  return *chosen;
}

dnnl::algorithm eltwise_of(Activation activation) {
  switch (activation) {
    case Activation::Relu: return dnnl::algorithm::eltwise_relu;
    case Activation::Sigmoid: return dnnl::algorithm::eltwise_logistic;
    case Activation::Tanh: return dnnl::algorithm::eltwise_tanh;
    case Activation::Linear:
    case Activation::Softmax: break;
  }
  return dnnl::algorithm::undef;
}

// Keras' bottom/right padding is what the output size implies; oneDNN wants it explicit. Negative amounts
// (a "valid" convolution whose last window leaves input over) are 0: oneDNN rounds the output size down.
memory::dims padding_after(const Conv2dGeometry& g) {
  const std::int64_t bottom = (g.out_h - 1) * g.stride_h + g.kernel_h - g.in_h - g.pad_top;
  const std::int64_t right = (g.out_w - 1) * g.stride_w + g.kernel_w - g.in_w - g.pad_left;
  return {std::max<std::int64_t>(bottom, 0), std::max<std::int64_t>(right, 0)};
}

// Copies between a tensor in its plain layout and the layout a primitive wants; a no-op where they agree.
class Reorder {
 public:
  Reorder(const memory::desc& from, const memory::desc& to) : from_(from), to_(to) {
    if (from != to) reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to));
  }
  bool needed() const { return reorder_.has_value(); }
  void run(dnnl::stream& stream, memory& from, memory& to) const { reorder_->execute(stream, from, to); }

 private:
  memory::desc from_, to_;
  std::optional<dnnl::reorder> reorder_;
};

}  // namespace

Bf16Kernels bf16_kernels() { return choice().kernels; }

void set_bf16_kernels(Bf16Kernels kernels) {
  Choice made = choose(kernels, "set_bf16_kernels(Bf16Kernels::Native) asks for them");
  const std::lock_guard lock(choice_mutex);
  chosen = std::move(made);
}

std::string bf16_kernels_description() { return choice().description; }

// ---- convolution

struct Convolution::Primitives {
  struct Key {
    std::int64_t batch;
    Activation activation;
    DType bias_type;  // Float32 also when there is no bias
    bool has_bias;
    auto operator<=>(const Key&) const = default;
  };
  struct Forward {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    Reorder kernel_in;
  };
  struct Backward {
    dnnl::convolution_backward_data::primitive_desc data_pd;
    dnnl::convolution_backward_data data;
    Reorder kernel_in;
    dnnl::convolution_backward_weights::primitive_desc weights_pd;
    dnnl::convolution_backward_weights weights;
    Reorder kernel_gradient_out;
  };
  std::mutex mutex;
  std::map<Key, Forward> forward;
  std::map<std::tuple<std::int64_t, bool>, Backward> backward;  // batch, whether dbias is computed
};

namespace {

struct ConvDescs {
  memory::desc src, weights_any, weights_hwio, dst, bias;
  memory::dims strides, pad_before, pad_after;
};

ConvDescs conv_descs(const Conv2dGeometry& g, memory::data_type bias_type, memory::data_type weights_type) {
  const auto bf16 = memory::data_type::bf16;
  const memory::dims weights{g.out_c, g.in_c, g.kernel_h, g.kernel_w};
  return {.src = memory::desc({g.batch, g.in_c, g.in_h, g.in_w}, bf16, Tag::nhwc),
          .weights_any = memory::desc(weights, weights_type, Tag::any),
          .weights_hwio = memory::desc(weights, weights_type, Tag::hwio),
          .dst = memory::desc({g.batch, g.out_c, g.out_h, g.out_w}, bf16, Tag::nhwc),
          .bias = memory::desc({g.out_c}, bias_type, Tag::a),
          .strides = {g.stride_h, g.stride_w},
          .pad_before = {g.pad_top, g.pad_left},
          .pad_after = padding_after(g)};
}

dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dGeometry& g, bool has_bias, memory::data_type bias_type,
                                                     Activation activation) {
  const ConvDescs d = conv_descs(g, bias_type, memory::data_type::bf16);
  const auto desc = has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                               d.src, d.weights_any, d.bias, d.dst, d.strides, d.pad_before, d.pad_after)
                             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                               d.src, d.weights_any, d.dst, d.strides, d.pad_before, d.pad_after);
  dnnl::primitive_attr attr;
  if (const auto eltwise = eltwise_of(activation); eltwise != dnnl::algorithm::undef) {
    dnnl::post_ops post;
    post.append_eltwise(1.0f, eltwise, 0.0f, 0.0f);
    attr.set_post_ops(post);
  }
  return {desc, attr, engine()};
}

}  // namespace

Convolution::Convolution() : primitives_(std::make_unique<Primitives>()) {}
Convolution::~Convolution() = default;

void Convolution::forward(const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel, const Tensor& bias,
                          Activation activation, const Tensor& y) {
  const bool has_bias = bias.defined();
  const Primitives::Key key{g.batch, activation, has_bias ? bias.dtype() : DType::Float32, has_bias};
  const std::unique_lock lock(primitives_->mutex);
  auto found = primitives_->forward.find(key);
  if (found == primitives_->forward.end()) {
    auto pd = forward_pd(g, has_bias, data_type(key.bias_type), activation);
    const ConvDescs d = conv_descs(g, data_type(key.bias_type), memory::data_type::bf16);
    Reorder kernel_in(d.weights_hwio, pd.weights_desc());
    found = primitives_->forward.emplace(key, Primitives::Forward{pd, dnnl::convolution_forward(pd), std::move(kernel_in)}).first;
  }
  const Primitives::Forward& f = found->second;
  dnnl::stream stream(engine());
  const ConvDescs d = conv_descs(g, data_type(key.bias_type), memory::data_type::bf16);
  memory user_kernel = wrap(d.weights_hwio, kernel);
  memory kernel_memory = user_kernel;
  if (f.kernel_in.needed()) {
    kernel_memory = memory(f.pd.weights_desc(), engine());
    f.kernel_in.run(stream, user_kernel, kernel_memory);
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(d.src, x)}, {DNNL_ARG_WEIGHTS, kernel_memory}, {DNNL_ARG_DST, wrap(d.dst, y)}};
  if (has_bias) args.emplace(DNNL_ARG_BIAS, wrap(d.bias, bias));
  f.primitive.execute(stream, args);
  stream.wait();
}

void Convolution::backward(const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel, const Tensor& dy,
                           const Tensor& dx, const Tensor& dkernel, const Tensor& dbias) {
  const bool has_bias = dbias.defined();
  const std::unique_lock lock(primitives_->mutex);
  const auto key = std::make_tuple(g.batch, has_bias);
  auto found = primitives_->backward.find(key);
  const ConvDescs d = conv_descs(g, memory::data_type::f32, memory::data_type::bf16);
  const ConvDescs f32 = conv_descs(g, memory::data_type::f32, memory::data_type::f32);
  if (found == primitives_->backward.end()) {
    const auto hint = forward_pd(g, has_bias, memory::data_type::f32, Activation::Linear);
    const dnnl::convolution_backward_data::desc data_desc(dnnl::algorithm::convolution_direct, d.src, d.weights_any, d.dst,
                                                          d.strides, d.pad_before, d.pad_after);
    const dnnl::convolution_backward_data::primitive_desc data_pd(data_desc, engine(), hint);
    const auto weights_desc =
        has_bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, f32.weights_any, f32.bias,
                                                            d.dst, d.strides, d.pad_before, d.pad_after)
                 : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, f32.weights_any, d.dst,
                                                            d.strides, d.pad_before, d.pad_after);
    const dnnl::convolution_backward_weights::primitive_desc weights_pd(weights_desc, engine(), hint);
    Reorder kernel_in(d.weights_hwio, data_pd.weights_desc());
    Reorder kernel_gradient_out(weights_pd.diff_weights_desc(), f32.weights_hwio);
    found = primitives_->backward
                .emplace(key, Primitives::Backward{data_pd, dnnl::convolution_backward_data(data_pd), std::move(kernel_in),
                                                   weights_pd, dnnl::convolution_backward_weights(weights_pd),
                                                   std::move(kernel_gradient_out)})
                .first;
  }
  const Primitives::Backward& b = found->second;
  dnnl::stream stream(engine());
  memory dy_memory = wrap(d.dst, dy);
  if (dx.defined()) {
    memory user_kernel = wrap(d.weights_hwio, kernel);
    memory kernel_memory = user_kernel;
    if (b.kernel_in.needed()) {
      kernel_memory = memory(b.data_pd.weights_desc(), engine());
      b.kernel_in.run(stream, user_kernel, kernel_memory);
    }
    b.data.execute(stream, {{DNNL_ARG_DIFF_DST, dy_memory}, {DNNL_ARG_WEIGHTS, kernel_memory}, {DNNL_ARG_DIFF_SRC, wrap(d.src, dx)}});
  }
  memory user_gradient = wrap(f32.weights_hwio, dkernel);
  memory gradient_memory = b.kernel_gradient_out.needed() ? memory(b.weights_pd.diff_weights_desc(), engine()) : user_gradient;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(d.src, x)}, {DNNL_ARG_DIFF_DST, dy_memory},
                                       {DNNL_ARG_DIFF_WEIGHTS, gradient_memory}};
  if (has_bias) args.emplace(DNNL_ARG_DIFF_BIAS, wrap(f32.bias, dbias));
  b.weights.execute(stream, args);
  if (b.kernel_gradient_out.needed()) b.kernel_gradient_out.run(stream, gradient_memory, user_gradient);
  stream.wait();
}

// ---- matrix products

namespace {

struct MatmulKey {
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
  DType c_type;
  float alpha, beta;
  auto operator<=>(const MatmulKey&) const = default;
};

// A row-major (rows x columns) matrix, or the transpose of one stored (columns x rows).
memory::desc matrix(std::int64_t rows, std::int64_t columns, bool transposed, memory::data_type type) {
  return transposed ? memory::desc({rows, columns}, type, memory::dims{1, rows}) : memory::desc({rows, columns}, type, memory::dims{columns, 1});
}

}  // namespace

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha, float beta) {
  const MatmulKey key{c.dim(0), c.dim(1), transpose_a ? a.dim(0) : a.dim(1), transpose_a, transpose_b, c.dtype(), alpha, beta};
  const auto bf16 = memory::data_type::bf16;
  const memory::desc a_desc = matrix(key.m, key.k, transpose_a, bf16), b_desc = matrix(key.k, key.n, transpose_b, bf16);
  const memory::desc c_desc = matrix(key.m, key.n, false, data_type(c.dtype()));
  static std::mutex mutex;
  static std::map<MatmulKey, dnnl::matmul> primitives;
  const std::unique_lock lock(mutex);
  auto found = primitives.find(key);
  if (found == primitives.end()) {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops post;
      post.append_sum(beta);
      attr.set_post_ops(post);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc, b_desc, c_desc), attr, engine());
    found = primitives.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::stream stream(engine());
  found->second.execute(stream, {{DNNL_ARG_SRC, wrap(a_desc, a)}, {DNNL_ARG_WEIGHTS, wrap(b_desc, b)}, {DNNL_ARG_DST, wrap(c_desc, c)}});
  stream.wait();
}

}  // namespace cohort::cpu::onednn
