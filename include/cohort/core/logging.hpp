#pragma once
// Minimal leveled logging to stderr, one line per call, with a wall-clock timestamp.
//
//   cohort::log::info("epoch {} took {:.1f} s", epoch, seconds);

#include <fmt/format.h>

#include <string_view>

namespace cohort::log {

enum class Level { Debug = 0, Info = 1, Warning = 2, Error = 3 };

void set_level(Level level);
Level level();
void write(Level level, std::string_view message);

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (level() <= Level::Debug) write(Level::Debug, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (level() <= Level::Info) write(Level::Info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void warning(fmt::format_string<Args...> format, Args&&... args) {
  if (level() <= Level::Warning) write(Level::Warning, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::Error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace cohort::log
