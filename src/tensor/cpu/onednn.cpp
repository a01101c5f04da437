// bfloat16 convolutions and matrix products, and float32 convolutions forward, through oneDNN (see
// onednn.hpp). The tensors' own memory is handed to oneDNN as NHWC activations and HWIO kernels, which
// oneDNN's "nhwc" and "hwio" tags describe exactly; a primitive may want its weights in a blocked layout of its
// own, so the kernel (or the kernel gradient) is reordered per call, one pass over a small tensor. Primitives
// are made once per shape.
#include "onednn.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "cohort/core/check.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/settings.hpp"
#include "im2col.hpp"
#include "scratch.hpp"
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
    case DType::UInt8: return memory::data_type::u8;
    case DType::Float32: break;
  }
  return memory::data_type::f32;
}

memory wrap(const memory::desc& desc, const Tensor& t) { return memory(desc, engine(), device_bytes(t)); }

// The instruction set COHORT_CPU_ISA names where it keeps below avx512, which keeps oneDNN's kernels off too.
std::optional<std::string> cpu_isa_below_avx512() {
  std::optional<std::string> isa = choice_setting("COHORT_CPU_ISA", kCpuIsaSpellings);
  return isa == "avx512" ? std::nullopt : isa;
}

// Why oneDNN cannot compute bfloat16 itself here; empty when it can.
std::string why_not_native() {
  if (const auto isa = cpu_isa_below_avx512())
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

// Whether oneDNN runs its AVX-512 kernels here (the processor has them, and ONEDNN_MAX_CPU_ISA allows them).
bool onednn_on_avx512() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_amx: return true;
    default: return false;
  }
}

// Why float32 convolutions do not run forward on oneDNN here; empty when they do.
std::string why_not_float32_forward() {
  if (const auto isa = cpu_isa_below_avx512()) return fmt::format("COHORT_CPU_ISA={} keeps to the backend's own kernels", *isa);
  if (!onednn_on_avx512() || !__builtin_cpu_is("intel"))
    return "the backend's Winograd and im2col kernels (oneDNN's are faster on Intel processors with AVX-512)";
  return {};
}

std::mutex float32_mutex;
std::optional<bool> float32_forward;

}  // namespace

bool float32_forward_convolutions() {
  const std::lock_guard lock(float32_mutex);
  if (!float32_forward) {
    float32_forward = why_not_float32_forward().empty();
    log::debug("float32 convolutions forward: {}", *float32_forward ? "oneDNN" : "the backend's own");
  }
  return *float32_forward;
}

void set_float32_forward_convolutions(bool on) {
  if (on && !onednn_on_avx512())
    throw InvalidArgument("float32 convolutions cannot run forward on oneDNN here: it needs AVX-512");
  const std::lock_guard lock(float32_mutex);
  float32_forward = on;
}

std::string float32_forward_convolutions_description() {
  const std::string why = why_not_float32_forward();
  if (float32_forward_convolutions()) return why.empty() ? "oneDNN (an Intel processor with AVX-512)" : "oneDNN (chosen)";
  return why.empty() ? "the backend's own (chosen)" : why;
}

Bf16Kernels bf16_kernels() { return choice().kernels; }

void set_bf16_kernels(Bf16Kernels kernels) {
  Choice made = choose(kernels, "set_bf16_kernels(Bf16Kernels::Native) asks for them");
  const std::lock_guard lock(choice_mutex);
  chosen = std::move(made);
}

std::string bf16_kernels_description() { return choice().description; }

// ---- convolution

struct Convolution::Primitives {
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

  struct Key {
    std::int64_t batch;
    DType data;  // of x, kernel and y
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
    // Unset where the kernel gradient is computed by products (kernel_gradient_by_products).
    std::optional<dnnl::convolution_backward_weights::primitive_desc> weights_pd;
    std::optional<dnnl::convolution_backward_weights> weights;
    std::optional<Reorder> kernel_gradient_out;
  };
  std::mutex mutex;
  std::map<Key, Forward> forward;
  std::map<std::tuple<std::int64_t, bool>, Backward> backward;  // batch, whether dbias is computed
  // The kernel gradient's products by a chunk's rows and whether a column of ones gives dbias.
  std::map<std::tuple<std::int64_t, bool>, dnnl::matmul> kernel_gradient_products;
};

namespace {

struct ConvDescs {
  memory::desc src, weights_any, weights_hwio, dst, bias;
  memory::dims strides, pad_before, pad_after;
};

// Descriptors of bfloat16 activations unless `data` says otherwise.
ConvDescs conv_descs(const Conv2dGeometry& g, memory::data_type bias_type, memory::data_type weights_type,
                     memory::data_type data = memory::data_type::bf16) {
  const memory::dims weights{g.out_c, g.in_c, g.kernel_h, g.kernel_w};
  return {.src = memory::desc({g.batch, g.in_c, g.in_h, g.in_w}, data, Tag::nhwc),
          .weights_any = memory::desc(weights, weights_type, Tag::any),
          .weights_hwio = memory::desc(weights, weights_type, Tag::hwio),
          .dst = memory::desc({g.batch, g.out_c, g.out_h, g.out_w}, data, Tag::nhwc),
          .bias = memory::desc({g.out_c}, bias_type, Tag::a),
          .strides = {g.stride_h, g.stride_w},
          .pad_before = {g.pad_top, g.pad_left},
          .pad_after = padding_after(g)};
}

dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dGeometry& g, bool has_bias, memory::data_type bias_type,
                                                     Activation activation, memory::data_type data = memory::data_type::bf16) {
  const ConvDescs d = conv_descs(g, bias_type, data, data);
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
  const Primitives::Key key{g.batch, x.dtype(), activation, has_bias ? bias.dtype() : DType::Float32, has_bias};
  const memory::data_type data = data_type(key.data);
  const std::unique_lock lock(primitives_->mutex);
  auto found = primitives_->forward.find(key);
  if (found == primitives_->forward.end()) {
    auto pd = forward_pd(g, has_bias, data_type(key.bias_type), activation, data);
    const ConvDescs d = conv_descs(g, data_type(key.bias_type), data, data);
    Primitives::Reorder kernel_in(d.weights_hwio, pd.weights_desc());
    found = primitives_->forward.emplace(key, Primitives::Forward{pd, dnnl::convolution_forward(pd), std::move(kernel_in)}).first;
  }
  const Primitives::Forward& f = found->second;
  dnnl::stream stream(engine());
  const ConvDescs d = conv_descs(g, data_type(key.bias_type), data, data);
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

namespace {

// The kernel gradient as matrix products: dkernel^T, with dbias as one more column, is dy^T x [im2col(x) | 1],
// summed over chunks of samples whose columns stay in L2, one chunk after another, each product on oneDNN's
// threads (one primitive run from several threads at once gave wrong sums on AMX). oneDNN 2.6's
// backward-weights convolution runs a jit kernel where its forward and its products run brgemm kernels (on
// AMX, for a dense columns matrix), and falls behind them where the output is small and the kernel deep.
// Measured at batch 128 (cohort_layer_profile), the whole backward pass with products against oneDNN's
// convolution: 6x6 -> 4x4 with 128 -> 128 channels 3.5 ms against 7.3 on one AMX core, 2.3 against 4.2 on
// two; 6x6 with 64 -> 128, 2.8 against 3.3 on one, 1.9 against 1.9 on two. The kernel gradient alone on one
// core: 13x13 outputs of 64 -> 64 channels 4.3 against 4.4, 15x15 of 32 -> 64 2.9 against 2.7, 30x30 of
// 32 -> 32 9-10 against 4.3, the 3-channel input layer 3.7 against 2.6 (its columns are 27 taps wide).
bool kernel_gradient_by_products(const Conv2dGeometry& g) { return g.out_h * g.out_w <= 64 && taps(g) >= 256; }

struct ProductLayout {
  std::int64_t taps, columns;  // columns: taps and the ones column of dbias, a row of the dense columns matrix
  std::int64_t pixels, samples_per_chunk, chunks;
};

ProductLayout product_layout(const Conv2dGeometry& g, bool has_bias) {
  constexpr std::int64_t kChunkElements = std::int64_t{1} << 19;  // 1 MiB of bfloat16 columns
  ProductLayout l{};
  l.taps = taps(g);
  l.columns = l.taps + (has_bias ? 1 : 0);
  l.pixels = g.out_h * g.out_w;
  l.samples_per_chunk = std::clamp<std::int64_t>(kChunkElements / std::max<std::int64_t>(1, l.pixels * l.columns), 1, g.batch);
  l.chunks = (g.batch + l.samples_per_chunk - 1) / l.samples_per_chunk;
  return l;
}

// The descriptors of one chunk's product: dy^T (a view of dy), the columns, and the float32 sums.
struct ProductDescs {
  memory::desc dy_t, columns, sums;
};

ProductDescs product_descs(const Conv2dGeometry& g, const ProductLayout& l, std::int64_t rows) {
  const auto bf16 = memory::data_type::bf16;
  return {memory::desc({g.out_c, rows}, bf16, memory::dims{1, g.out_c}),
          memory::desc({rows, l.columns}, bf16, memory::dims{l.columns, 1}),
          memory::desc({g.out_c, l.columns}, memory::data_type::f32, memory::dims{l.columns, 1})};
}

dnnl::matmul make_product(const Conv2dGeometry& g, const ProductLayout& l, std::int64_t rows) {
  const auto [dy_t, columns, sums] = product_descs(g, l, rows);
  dnnl::primitive_attr attr;
  dnnl::post_ops post;
  post.append_sum(1.0f);
  attr.set_post_ops(post);
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(dy_t, columns, sums), attr, engine()));
}

}  // namespace

void Convolution::backward(const Conv2dGeometry& g, const Tensor& x, const Tensor& kernel, const Tensor& dy,
                           const Tensor& dx, const Tensor& dkernel, const Tensor& dbias) {
  const bool has_bias = dbias.defined();
  const bool by_products = kernel_gradient_by_products(g);
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
    Primitives::Reorder kernel_in(d.weights_hwio, data_pd.weights_desc());
    Primitives::Backward made{data_pd, dnnl::convolution_backward_data(data_pd), std::move(kernel_in), {}, {}, {}};
    if (!by_products) {
      const auto weights_desc =
          has_bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, f32.weights_any,
                                                              f32.bias, d.dst, d.strides, d.pad_before, d.pad_after)
                   : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.src, f32.weights_any,
                                                              d.dst, d.strides, d.pad_before, d.pad_after);
      made.weights_pd.emplace(weights_desc, engine(), hint);
      made.weights.emplace(*made.weights_pd);
      made.kernel_gradient_out.emplace(made.weights_pd->diff_weights_desc(), f32.weights_hwio);
    }
    found = primitives_->backward.emplace(key, std::move(made)).first;
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
  if (by_products) {
    stream.wait();
    return kernel_gradient_from_products(g, x, dy, dkernel, dbias);
  }
  memory user_gradient = wrap(f32.weights_hwio, dkernel);
  memory gradient_memory = b.kernel_gradient_out->needed() ? memory(b.weights_pd->diff_weights_desc(), engine()) : user_gradient;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(d.src, x)}, {DNNL_ARG_DIFF_DST, dy_memory},
                                       {DNNL_ARG_DIFF_WEIGHTS, gradient_memory}};
  if (has_bias) args.emplace(DNNL_ARG_DIFF_BIAS, wrap(f32.bias, dbias));
  b.weights->execute(stream, args);
  if (b.kernel_gradient_out->needed()) b.kernel_gradient_out->run(stream, gradient_memory, user_gradient);
  stream.wait();
}

// Called with the primitives' lock held.
void Convolution::kernel_gradient_from_products(const Conv2dGeometry& g, const Tensor& x, const Tensor& dy,
                                                const Tensor& dkernel, const Tensor& dbias) {
  constexpr std::uint16_t kBfloat16One = 0x3f80;
  const bool has_bias = dbias.defined();
  const ProductLayout l = product_layout(g, has_bias);
  const auto product = [&](std::int64_t rows) -> const dnnl::matmul& {
    auto made = primitives_->kernel_gradient_products.find({rows, has_bias});  // made once per shape
    if (made == primitives_->kernel_gradient_products.end())
      made = primitives_->kernel_gradient_products.emplace(std::make_tuple(rows, has_bias), make_product(g, l, rows)).first;
    return made->second;
  };
  float* sums = thread_scratch(ScratchSlot::Partials, static_cast<std::size_t>(g.out_c * l.columns));
  std::fill_n(sums, g.out_c * l.columns, 0.0f);
  auto* col = reinterpret_cast<std::uint16_t*>(
      thread_scratch(ScratchSlot::Columns, static_cast<std::size_t>(l.samples_per_chunk * l.pixels * l.columns + 1) / 2));
  const auto* in = static_cast<const std::uint16_t*>(device_bytes(x));
  auto* gradient = static_cast<std::uint16_t*>(device_bytes(dy));
  const std::int64_t in_sample = g.in_h * g.in_w * g.in_c;
  dnnl::stream stream(engine());
  for (std::int64_t chunk = 0; chunk < l.chunks; ++chunk) {
    const std::int64_t first = chunk * l.samples_per_chunk;
    const std::int64_t count = std::min(l.samples_per_chunk, g.batch - first);
    const std::int64_t rows = count * l.pixels;
    // The chunk's columns, a sample per thread at a time.
#pragma omp parallel for if (count > 1)
    for (std::int64_t s = 0; s < count; ++s) im2col(in + (first + s) * in_sample, g, col + s * l.pixels * l.columns, l.columns);
    if (has_bias)
      for (std::int64_t r = 0; r < rows; ++r) col[r * l.columns + l.taps] = kBfloat16One;
    const ProductDescs d = product_descs(g, l, rows);
    product(rows).execute(stream, {{DNNL_ARG_SRC, memory(d.dy_t, engine(), gradient + first * l.pixels * g.out_c)},
                                   {DNNL_ARG_WEIGHTS, memory(d.columns, engine(), col)},
                                   {DNNL_ARG_DST, memory(d.sums, engine(), sums)}});
    stream.wait();  // before the next chunk's columns overwrite these
  }
  // sums hold dkernel^T (and dbias): HWIO is its transpose.
  float* kernel_gradient = device_data(dkernel);
  for (std::int64_t o = 0; o < g.out_c; ++o) {
    for (std::int64_t t = 0; t < l.taps; ++t) kernel_gradient[t * g.out_c + o] = sums[o * l.columns + t];
    if (has_bias) device_data(dbias)[o] = sums[o * l.columns + l.taps];
  }
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
