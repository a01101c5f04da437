#include "cohort/core/logging.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace cohort::log {
namespace {
std::atomic<Level> current_level{Level::Info};
std::mutex write_mutex;

const char* tag(Level level) {
  switch (level) {
    case Level::Debug: return "D";
    case Level::Info: return "I";
    case Level::Warning: return "W";
    case Level::Error: return "E";
  }
  return "?";
}
}  // namespace

void set_level(Level level) { current_level = level; }
Level level() { return current_level; }

void write(Level level, std::string_view message) {
  using Clock = std::chrono::system_clock;
  const auto now = Clock::now();
  const std::time_t seconds = Clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &local);
  const std::lock_guard lock(write_mutex);
  std::fprintf(stderr, "%s %s.%03lld %.*s\n", tag(level), stamp, static_cast<long long>(millis),
               static_cast<int>(message.size()), message.data());
}

}  // namespace cohort::log
