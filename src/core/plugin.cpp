#include "core/plugin.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>

#include "cohort/core/config.hpp"

namespace cohort {
namespace {

// The directory of the file this code was loaded from (libcohort.so, or the program it is linked into).
std::filesystem::path own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code error;
  const auto path = std::filesystem::canonical(info.dli_fname, error);
  return error ? std::filesystem::path() : path.parent_path();
}

std::string last_dl_error() {
  const char* error = ::dlerror();
  return error != nullptr ? error : "unknown reason";
}

}  // namespace

LoadedPlugin load_plugin(const PluginSpec& spec) {
  const auto [file, entry, what, package, layout, global, not_built] = spec;
  if (not_built != nullptr) return {nullptr, not_built};
  const int flags = RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL);
  const std::filesystem::path beside = own_directory() / file;
  std::error_code error;
  void* handle = nullptr;
  std::string where;
  if (!beside.parent_path().empty() && std::filesystem::exists(beside, error)) {
    // Found: a failure now is one of its own libraries missing ("libcudnn.so.9: cannot open ..."), not it.
    handle = ::dlopen(beside.c_str(), flags);
    if (handle == nullptr)
      return {nullptr, fmt::format("{} ({}) is installed but cannot be loaded: {}", what, beside.string(), last_dl_error())};
    where = beside.string();
  } else {
    handle = ::dlopen(file, flags);
    if (handle == nullptr) {
      const std::string reason = last_dl_error();
      if (reason.find(file) != std::string::npos && reason.find("cannot open shared object file") != std::string::npos)
        return {nullptr, fmt::format("{} is not installed: no {} next to libcohort ({}) nor on the loader's path "
                                     "(Debian: apt-get install {})",
                                     what, file, beside.parent_path().string(), package)};
      return {nullptr, fmt::format("{} ({}) is installed but cannot be loaded: {}", what, file, reason)};
    }
    where = file;
  }
  using Entry = const PluginHeader* (*)();
  const auto get_table = reinterpret_cast<Entry>(::dlsym(handle, entry));
  if (get_table == nullptr) return {nullptr, fmt::format("{} ({}) has no entry point {}: not a cohort part", what, where, entry)};
  const PluginHeader* table = get_table();
  if (std::strcmp(table->cohort_version, COHORT_VERSION_STRING) != 0 || table->layout != layout)
    return {nullptr, fmt::format("{} ({}) was built for cohort {} (layout {}), this libcohort is {} (layout {}): install "
                                 "the two from one build",
                                 what, where, table->cohort_version, table->layout, COHORT_VERSION_STRING, layout)};
  return {table, {}};  // never unloaded: its objects live as long as the process
}

}  // namespace cohort
