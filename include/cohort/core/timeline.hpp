#pragma once
// Timeline: where a process's time goes, step by step, as a Chrome trace (the JSON that chrome://tracing
// and Perfetto open). While recording, spans are kept in memory (a lock per event, a few dozen per step);
// when not, a Span costs one relaxed atomic load. Times are wall-clock microseconds, so that traces of
// processes on one host (or hosts with synchronized clocks) line up when merged.
//
//   timeline::start("chief 0");
//   { timeline::Span span("forward", layer.name()); layer.forward(x); }
//   timeline::stop_and_write("trace.json");

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::timeline {

using Clock = std::chrono::system_clock;

// Begins recording this process's events, forgetting earlier ones; `process` names its track.
void start(std::string process);
bool recording();
// Throws IoError saying why when a timeline could not be written to `path` (checked before a run, so
// that a bad path does not cost it). A symbolic link is written through; an existing file that is not a
// regular file (a device, a pipe, a directory) is refused.
void check_writable(const std::filesystem::path& path);
// Stops recording and writes what was recorded to `path` (whole, or not at all; as check_writable says).
// `merge_into`, when not empty, is stored in the trace for cohort-launch, which merges the traces of a job
// into that file.
void stop_and_write(const std::filesystem::path& path, const std::filesystem::path& merge_into = {});
// Stops recording and forgets the events.
void discard();

// Names the calling thread's track (the thread that called start() is "main", others "thread N" unless named).
void name_this_thread(std::string name);

// An event that began at `begin` and ends now, on the calling thread's track.
void record(std::string_view category, std::string_view name, Clock::time_point begin);

// A sample of named values at this moment (a Chrome counter event, drawn as a chart above the process's
// tracks), when recording.
void counter(std::string_view name, std::initializer_list<std::pair<std::string_view, double>> values);

// Records its own lifetime as an event on the calling thread's track, when recording at construction.
// The category and name must outlive it.
class Span {
 public:
  Span(std::string_view category, std::string_view name);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string_view category_, name_;
  Clock::time_point begin_;
  bool active_;
};

// Merges Chrome traces written by stop_and_write() into one, a track per process (sorted by the order
// of `parts`); DataError naming the file for one that is not such a trace.
void merge(const std::vector<std::filesystem::path>& parts, const std::filesystem::path& into);
// Merges the traces in `directory` (in file-name order) into the files they name as merge_into. A part
// that cannot be read or merged is left out and reported; the others are merged.
struct MergeReport {
  std::vector<std::filesystem::path> written;
  std::vector<std::string> problems;
};
MergeReport merge_directory(const std::filesystem::path& directory);

}  // namespace cohort::timeline
