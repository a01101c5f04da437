#pragma once
// Derivation of independent, reproducible random seeds from a root seed and a key, so that every
// consumer of randomness (a variable's initializer, a dropout layer, sample i of epoch e) gets its own
// stream whatever the order or thread in which it is used.
//
//   std::mt19937_64 rng(derive_seed(model_seed, "conv2d/kernel"));

#include <cstdint>
#include <string_view>

namespace cohort {

// SplitMix64 finalizer: a bijective 64-bit mixer.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t key) { return mix64(seed ^ mix64(key)); }

constexpr std::uint64_t derive_seed(std::uint64_t seed, std::string_view key) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return derive_seed(seed, h);
}

}  // namespace cohort
