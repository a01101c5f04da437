#pragma once
// Gradient codecs: what a bucket of gradients becomes on its way over the replicas. A codec is handed
// this replica's gradients of one bucket (each weighted by this replica's samples, as the synchronizer
// weights them) and a sum over the replicas; it sends what it chooses through the sum and leaves in every
// gradient the same approximation of their sum on every replica. PowerSGD is built in; any type with
// name() and reduce() (the GradientCodecLike concept) is a codec too. Float32 gradients that travel as
// bfloat16 are the synchronizer's wire type (RingAllreduceOptions::gradient_dtype), not a codec: the ring
// adds them as they arrive.
//
//   train::RingAllreduce ring(transport, {.codec = train::PowerSgd({.rank = 4})});

#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cohort/nn/replica_sum.hpp"
#include "cohort/tensor/tensor.hpp"

namespace cohort::train {

// One variable's gradient in the bucket: a view with the variable's shape, on the model's device.
struct BucketGradient {
  std::string name;
  Tensor gradient;
};

// What a codec sums through: nn::ReplicaSum (in place, every replica alike, in call order), and how many
// replicas there are.
class ReplicaReduction : public nn::ReplicaSum {
 public:
  virtual int replicas() const = 0;
};

template <typename C>
concept GradientCodecLike = requires(C& codec, std::span<const BucketGradient> gradients, ReplicaReduction& reduction) {
  { codec.name() } -> std::convertible_to<std::string>;
  // Every replica calls it for the same buckets in the same order; afterwards each gradient holds the
  // same bits on every replica.
  { codec.reduce(gradients, reduction) } -> std::same_as<void>;
};

// Any codec behind one type, chosen at run time. A copy is a codec of its own, with state of its own (each
// strategy keeps its own PowerSGD error feedback, also when several are made from one set of options).
class GradientCodec {
 public:
  template <GradientCodecLike C>
  GradientCodec(C codec)  // NOLINT: implicit, so that any codec converts
      : held_(std::make_unique<Held<C>>(std::move(codec))) {}
  GradientCodec(const GradientCodec& other) : held_(other.held_->clone()) {}
  GradientCodec& operator=(const GradientCodec& other) {
    held_ = other.held_->clone();
    return *this;
  }
  GradientCodec(GradientCodec&&) noexcept = default;
  GradientCodec& operator=(GradientCodec&&) noexcept = default;

  std::string name() const { return held_->name(); }
  void reduce(std::span<const BucketGradient> gradients, ReplicaReduction& reduction) { held_->reduce(gradients, reduction); }

 private:
  struct Codec {
    virtual ~Codec() = default;
    virtual std::unique_ptr<Codec> clone() const = 0;
    virtual std::string name() const = 0;
    virtual void reduce(std::span<const BucketGradient> gradients, ReplicaReduction& reduction) = 0;
  };
  template <class C>
  struct Held final : Codec {
    explicit Held(C c) : codec(std::move(c)) {}
    std::unique_ptr<Codec> clone() const override { return std::make_unique<Held>(codec); }
    std::string name() const override { return codec.name(); }
    void reduce(std::span<const BucketGradient> gradients, ReplicaReduction& reduction) override { codec.reduce(gradients, reduction); }
    C codec;
  };
  std::unique_ptr<Codec> held_;
};

struct PowerSgdOptions {
  int rank = 4;  // of each gradient matrix's approximation
  // A gradient is compressed when its elements are at least this many times the rank-r factors' (rows +
  // columns) x r; biases, other vectors and small matrices are summed as they are.
  double min_compression = 2.0;
  bool error_feedback = true;  // what the approximation missed is added to the next step's gradient
  std::uint64_t seed = 0;      // of the first step's random factors, the same on every replica
};

// PowerSGD (Vogels, Karimireddy and Jaggi 2019), as PyTorch's powerSGD_hook: each gradient, viewed as a
// matrix M (its last axis the columns), plus the error left from the last step, is approximated as P Q^T
// with one power iteration from the last step's Q (warm start): P = M Q summed over the replicas and
// orthogonalized, Q = M^T P summed, so that each replica sends (rows + columns) x r numbers instead of
// rows x columns. Every replica then holds P Q^T, and keeps M - P Q^T / replicas as its error.
class PowerSgd {
 public:
  explicit PowerSgd(PowerSgdOptions options = {});
  std::string name() const;
  void reduce(std::span<const BucketGradient> gradients, ReplicaReduction& reduction);

 private:
  struct State {
    Tensor error;  // rows x columns
    Tensor q;      // columns x rank: the warm start
    std::uint64_t restarts = 0;  // of factors that fell to zero
  };
  // The next step starts from this step's Q, with any column that fell to zero drawn afresh.
  static void warm_start(State& state, const Tensor& q, std::uint64_t seed);
  PowerSgdOptions options_;
  std::map<std::string, State> state_;
};

// "powersgd" (rank 4) or "powersgd:R"; throws InvalidArgument naming the text otherwise.
GradientCodec parse_codec(std::string_view text);

}  // namespace cohort::train
