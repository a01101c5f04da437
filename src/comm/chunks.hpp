#pragma once
// How the collectives cut a vector among the ranks of a group.
#include <algorithm>
#include <cstddef>
#include <span>

namespace cohort::comm {

// Chunk `chunk` of `data` cut into n near-equal chunks, the first data.size() % n of them one element longer.
template <typename T>
std::span<T> ring_chunk(std::span<T> data, int n, int chunk) {
  const auto begin = [&](int c) {
    const auto index = static_cast<std::size_t>(c), ranks = static_cast<std::size_t>(n);
    return index * (data.size() / ranks) + std::min(index, data.size() % ranks);
  };
  return data.subspan(begin(chunk), begin(chunk + 1) - begin(chunk));
}

}  // namespace cohort::comm
