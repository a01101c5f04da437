#include "cohort/core/timeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cohort/core/error.hpp"

namespace cohort::timeline {
namespace {

struct Event {
  std::string category, name;
  std::int64_t begin_us, duration_us;
  int thread;
};

struct CounterSample {
  std::string name;
  std::int64_t at_us;
  std::vector<std::pair<std::string, double>> values;
};

struct Recorder {
  std::atomic<bool> recording{false};
  std::mutex mutex;
  std::string process;
  std::vector<Event> events;
  std::vector<CounterSample> counters;
  std::map<int, std::string> thread_names;
  int next_thread = 0;
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

std::int64_t microseconds(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// The calling thread's track number, given on its first event; the recorder's lock is held.
int this_thread_track(Recorder& r) {
  thread_local int track = -1;
  if (track < 0) {
    track = r.next_thread++;
    r.thread_names.try_emplace(track, fmt::format("thread {}", track));
  }
  return track;
}

nlohmann::json metadata(const char* what, int pid, int tid, nlohmann::json args) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// Where a timeline for `path` goes: through a symbolic link to its target; refused when that is not a
// regular file (a device, a pipe, a directory), which a rename would replace.
std::filesystem::path resolved_destination(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::path target = path;
  for (int links = 0; links < 40 && std::filesystem::is_symlink(target, error); ++links) {
    const std::filesystem::path next = std::filesystem::read_symlink(target, error);
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const auto status = std::filesystem::status(target, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw IoError(fmt::format("cannot write the timeline {}: it exists and is not a regular file", path.string()));
  return target;
}

void write_whole(const std::filesystem::path& path, const nlohmann::json& trace) {
  const std::filesystem::path destination = resolved_destination(path);
  const std::filesystem::path partial = destination.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(fmt::format("cannot write the timeline {}: {}", path.string(), std::strerror(errno)));
    out << trace.dump() << '\n';
    if (!out.flush()) throw IoError(fmt::format("cannot write the timeline {}: {}", path.string(), std::strerror(errno)));
  }
  std::error_code error;
  std::filesystem::rename(partial, destination, error);
  if (error) {
    std::filesystem::remove(partial, error);
    throw IoError(fmt::format("cannot write the timeline {}: {}", path.string(), error.message()));
  }
}

nlohmann::json read_trace(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read the timeline {}", path.string()));
  try {
    nlohmann::json trace = nlohmann::json::parse(in);
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
      throw std::runtime_error("no traceEvents array");
    return trace;
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{} is not a timeline written by cohort: {}", path.string(), e.what()));
  }
}

}  // namespace

void check_writable(const std::filesystem::path& path) {
  const std::filesystem::path probe = resolved_destination(path).string() + ".partial";
  if (!std::ofstream(probe)) throw IoError(fmt::format("cannot write the timeline {}: {}", path.string(), std::strerror(errno)));
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
}

void start(std::string process) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.process = std::move(process);
  r.events.clear();
  r.counters.clear();
  r.thread_names[this_thread_track(r)] = "main";
  r.recording.store(true, std::memory_order_relaxed);
}

bool recording() { return recorder().recording.load(std::memory_order_relaxed); }

void name_this_thread(std::string name) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.thread_names[this_thread_track(r)] = std::move(name);
}

void record(std::string_view category, std::string_view name, Clock::time_point begin) {
  Recorder& r = recorder();
  if (!r.recording.load(std::memory_order_relaxed)) return;
  const auto end = Clock::now();
  std::lock_guard lock(r.mutex);
  r.events.push_back({std::string(category), std::string(name), microseconds(begin), microseconds(end) - microseconds(begin),
                      this_thread_track(r)});
}

void counter(std::string_view name, std::initializer_list<std::pair<std::string_view, double>> values) {
  Recorder& r = recorder();
  if (!r.recording.load(std::memory_order_relaxed)) return;
  CounterSample sample{std::string(name), microseconds(Clock::now()), {}};
  for (const auto& [label, value] : values) sample.values.emplace_back(label, value);
  std::lock_guard lock(r.mutex);
  r.counters.push_back(std::move(sample));
}

Span::Span(std::string_view category, std::string_view name)
    : category_(category), name_(name), active_(recording()) {
  if (active_) begin_ = Clock::now();
}

Span::~Span() {
  if (active_) record(category_, name_, begin_);
}

void discard() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.recording.store(false, std::memory_order_relaxed);
  r.events.clear();
  r.counters.clear();
}

void stop_and_write(const std::filesystem::path& path, const std::filesystem::path& merge_into) {
  Recorder& r = recorder();
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard lock(r.mutex);
    r.recording.store(false, std::memory_order_relaxed);
    const int pid = static_cast<int>(::getpid());
    events.push_back(metadata("process_name", pid, 0, {{"name", r.process}}));
    for (const auto& [track, name] : r.thread_names) events.push_back(metadata("thread_name", pid, track, {{"name", name}}));
    for (const Event& e : r.events)
      events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", e.begin_us}, {"dur", e.duration_us},
                        {"pid", pid}, {"tid", e.thread}});
    for (const CounterSample& c : r.counters) {
      nlohmann::json values = nlohmann::json::object();
      for (const auto& [label, value] : c.values) values[label] = value;
      events.push_back({{"name", c.name}, {"ph", "C"}, {"ts", c.at_us}, {"pid", pid}, {"tid", 0}, {"args", std::move(values)}});
    }
    r.events.clear();
    r.counters.clear();
  }
  nlohmann::json trace{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (!merge_into.empty()) trace["otherData"] = {{"merge_into", merge_into.string()}};
  write_whole(path, trace);
}

void merge(const std::vector<std::filesystem::path>& parts, const std::filesystem::path& into) {
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t index = 0; index < parts.size(); ++index) {
    nlohmann::json part = read_trace(parts[index]);
    try {
      // One track per part, in the order given, whatever pids the processes had.
      const int pid = static_cast<int>(index);
      for (auto& event : part["traceEvents"]) {
        if (!event.is_object()) throw std::runtime_error("an event that is not an object");
        event["pid"] = pid;
        events.push_back(std::move(event));
      }
      events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
    } catch (const std::exception& e) {
      throw DataError(fmt::format("{} is not a timeline written by cohort: {}", parts[index].string(), e.what()));
    }
  }
  write_whole(into, {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}});
}

MergeReport merge_directory(const std::filesystem::path& directory) {
  MergeReport report;
  std::error_code error;
  std::vector<std::filesystem::path> parts;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".json") parts.push_back(entry.path());
  std::sort(parts.begin(), parts.end());
  std::map<std::filesystem::path, std::vector<std::filesystem::path>> by_destination;
  for (const auto& part : parts) {
    try {
      const nlohmann::json trace = read_trace(part);
      const auto other = trace.find("otherData");
      if (other == trace.end() || !other->contains("merge_into") || !(*other)["merge_into"].is_string())
        throw DataError(fmt::format("{} does not say which file to merge it into", part.string()));
      by_destination[(*other)["merge_into"].get<std::string>()].push_back(part);
    } catch (const Error& e) {
      report.problems.push_back(e.what());  // one bad part does not cost the others
    }
  }
  for (const auto& [destination, group] : by_destination) {
    try {
      merge(group, destination);
      report.written.push_back(destination);
    } catch (const Error& e) {
      report.problems.push_back(e.what());
    }
  }
  return report;
}

}  // namespace cohort::timeline
