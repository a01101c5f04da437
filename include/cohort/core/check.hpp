#pragma once
// COHORT_CHECK(cond, fmt, args...) throws cohort::InvalidArgument with the formatted message when cond is
// false. It is always on; COHORT_DCHECK is the debug-only variant for inner loops. The message is for the
// user and names the cause; it carries no source location (a debugger stops at the throw).
//
//   COHORT_CHECK(x.rank() == 4, "Conv2D expects NHWC input, got shape {}", x.shape());

#include <fmt/format.h>

#include "cohort/core/error.hpp"

namespace cohort::detail {

template <typename ErrorType = InvalidArgument, typename... Args>
[[noreturn]] void fail_check(fmt::format_string<Args...> format, Args&&... args) {
  throw ErrorType(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace cohort::detail

#define COHORT_CHECK(cond, ...)                                                     \
  do {                                                                              \
    if (!(cond)) [[unlikely]] {                                                     \
      ::cohort::detail::fail_check(__VA_ARGS__);         \
    }                                                                               \
  } while (false)

#define COHORT_CHECK_AS(error_type, cond, ...)                                              \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::cohort::detail::fail_check<error_type>(__VA_ARGS__);     \
    }                                                                                       \
  } while (false)

#ifdef NDEBUG
#define COHORT_DCHECK(cond, ...) \
  do {                           \
  } while (false)
#else
#define COHORT_DCHECK(cond, ...) COHORT_CHECK(cond, __VA_ARGS__)
#endif
