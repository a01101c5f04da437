#pragma once
// Helpers shared by the test files.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "cohort/tensor/gemm_path.hpp"
#include "cohort/tensor/tensor.hpp"

namespace test_util {

inline cohort::Tensor random_tensor(const cohort::Shape& shape, std::uint64_t seed, float low = -1.0f, float high = 1.0f) {
  cohort::Tensor t(shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  for (float& v : t.values()) v = uniform(rng);
  return t;
}

// The first element where |actual - expected| > tolerance * (|expected| + rms(expected)): relative, with the
// values' magnitude as the floor where one is near zero; with what it was allowed. Nullopt when none.
struct Beyond {
  std::size_t index;
  double allowed;
};
inline std::optional<Beyond> first_beyond(const std::vector<float>& expected, const std::vector<float>& actual,
                                          double tolerance) {
  double squares = 0;
  for (float v : expected) squares += static_cast<double>(v) * v;
  const double rms = expected.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(expected.size()));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double allowed = tolerance * (std::abs(expected[i]) + rms) + 1e-30;
    if (!(std::abs(static_cast<double>(actual[i]) - expected[i]) <= allowed)) return Beyond{i, allowed};
  }
  return std::nullopt;
}

// An operand of a test of a 16-bit op: activations in the op's 16-bit type ("low"), or float32 ("wide": what a
// layer keeps in float32 under a mixed policy, such as biases, batch normalization's scale and statistics,
// weight gradients); written by the op or not; and the range of its random values.
struct Operand16 {
  cohort::Shape shape;
  bool low = true;
  bool output = false;
  float min = -1.0f, max = 1.0f;
};
inline Operand16 low_in(cohort::Shape shape, float min = -1.0f, float max = 1.0f) { return {std::move(shape), true, false, min, max}; }
inline Operand16 low_out(cohort::Shape shape) { return {std::move(shape), true, true}; }
inline Operand16 wide_in(cohort::Shape shape, float min = -1.0f, float max = 1.0f) { return {std::move(shape), false, false, min, max}; }
inline Operand16 wide_out(cohort::Shape shape) { return {std::move(shape), false, true}; }

inline float max_abs_difference(const cohort::Tensor& a, const cohort::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  float worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]));
  return worst;
}

// A fresh directory under the system temp folder, removed when the object goes away.
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("cohort_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// What the process writes to `fd` (STDOUT_FILENO, STDERR_FILENO) while this object lives: text() ends the
// capture and returns it.
class CapturedOutput {
 public:
  explicit CapturedOutput(int fd) : fd_(fd), file_(std::tmpfile()), saved_(::dup(fd)) {
    REQUIRE(file_ != nullptr);
    flush();
    ::dup2(::fileno(file_), fd_);
  }
  ~CapturedOutput() {
    restore();
    std::fclose(file_);
  }
  CapturedOutput(const CapturedOutput&) = delete;
  CapturedOutput& operator=(const CapturedOutput&) = delete;
  std::string text() {
    restore();
    std::rewind(file_);
    std::string text;
    for (int c; (c = std::fgetc(file_)) != EOF;) text += static_cast<char>(c);
    return text;
  }

 private:
  static void flush() {
    std::fflush(stdout);
    std::fflush(stderr);
  }
  void restore() {
    if (saved_ < 0) return;
    flush();
    ::dup2(saved_, fd_);
    ::close(saved_);
    saved_ = -1;
  }
  int fd_;
  std::FILE* file_;
  int saved_;
};

// Runs body(path) once per GEMM path this build has, with that path chosen; the earlier choice after.
template <typename Body>
void for_each_gemm_path(Body&& body) {
  struct Restore {
    cohort::GemmPath chosen = cohort::gemm_path();
    ~Restore() { cohort::set_gemm_path(chosen); }
  } restore;
  for (cohort::GemmPath path : cohort::available_gemm_paths()) {
    cohort::set_gemm_path(path);
    body(path);
  }
}

}  // namespace test_util
