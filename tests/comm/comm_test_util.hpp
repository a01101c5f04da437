#pragma once
// Runs one function per rank on its own thread and collects the first failure, for transport tests.

#include <catch2/catch.hpp>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace comm_test {

// Calls body(rank) for every rank concurrently; rethrows the first exception after all threads end.
inline void run_ranks(int ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace comm_test
