// cohort-launch: starts a local cluster of one program on 127.0.0.1 and watches it.
//
//   cohort-launch --workers 2 --ps 2 -- ./build/examples/cifar10 --epochs 1
//
// Each process gets TF_CONFIG (the first worker is the chief), a fresh shared secret in COHORT_SECRET and
// free ports; every line it prints comes out whole, prefixed with its role and index, on the stream it
// was written to (each child's stdout and stderr are separate pipes, read line by line). When the
// launcher's stdout is a terminal, the chief draws its live progress bar (COHORT_PROGRESS=bar), shown
// here as a status line below the others' output. When a process fails, the
// others get a grace period to notice and exit by themselves (they name the lost peer), then are
// stopped; the launcher exits non-zero with a one-line summary of who failed and how. A process that the
// failing ones report lost while it still runs (hung, or stopped by a signal) is named as the cause, and
// killed as soon as every other process has ended. Ctrl-C stops all.
// With --restarts N a failed job is started again, up to N times, with COHORT_RESTART set to the
// restart's number: fit() then continues from the latest checkpoint of its checkpoint directory.
// Unless OMP_NUM_THREADS is set, the cores are shared among the workers; parameter servers get one thread.
// With --gpus N the workers take turns over N GPUs through CUDA_VISIBLE_DEVICES (several may share one;
// the GPUs are those the launcher itself sees), and parameter servers get none. Workers also get
// LOCAL_RANK and LOCAL_WORLD_SIZE, as under torchrun. A program run with --timeline FILE (FitOptions::timeline)
// leaves each process's trace in COHORT_TIMELINE_PARTS; the launcher merges them into FILE at the end of
// the run, failed or not (processes stopped by Ctrl-C or a signal write none).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <CLI/CLI.hpp>

#include "cohort/app/command_line.hpp"
#include "cohort/cluster/discovery.hpp"
#include "cohort/core/settings.hpp"
#include "cohort/core/timeline.hpp"
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int workers = 1;
  int ps = 0;
  std::string host = "127.0.0.1";
  std::chrono::seconds grace{20};
  int restarts = 0;
  int gpus = 0;  // 0: CUDA_VISIBLE_DEVICES left as it is
  std::vector<std::string> command;
};

struct Process {
  std::string name;  // "chief 0", "worker 1", "ps 0"
  std::string tf_config;
  std::string visible_gpus;  // CUDA_VISIBLE_DEVICES under --gpus
  int worker_index = -1;     // 0 for the chief, 1.. for the other workers; -1 for parameter servers
  pid_t pid = -1;
  // The read ends of the pipes carrying its stdout and its stderr, and what came after the last newline.
  struct Stream {
    int fd = -1;
    std::string partial;
    std::FILE* to = stdout;  // where its lines go: the launcher's stream of the same kind
  };
  Stream out, err;
  std::optional<int> status;  // waitpid status once exited
  std::optional<int> stopped_by;          // the signal that stopped it, while it is stopped
  std::vector<std::string> reported_lost_by;  // processes whose output says they lost this one
  std::vector<std::string> reported_stuck_by;  // ... or that it is alive but makes no progress
  std::vector<std::string> reported_failed_by;  // ... or that it failed ("ps 0 failed: ...")
  // Processes whose failure this one's passed on: named in its own "ps 0 failed: ..." or after its name in
  // another's "chief 0 failed: ps 0 failed: ...".
  std::vector<std::string> failed_because_of;
  bool outlived_failure = false;  // killed after it went on alone once every other process had failed
  bool killed_as_hung = false;
};

int signal_pipe[2] = {-1, -1};
const bool terminal_output = ::isatty(STDOUT_FILENO) != 0;
bool status_line_shown = false;  // the chief's live progress line is on the terminal's last line

void on_signal(int number) {
  const unsigned char byte = static_cast<unsigned char>(number);
  [[maybe_unused]] const auto ignored = ::write(signal_pipe[1], &byte, 1);
}

// Why execvp() would not start `program` (a path, or a name looked up on PATH), checked before any
// process starts; empty when it would.
std::string cannot_run(const std::string& program) {
  const auto runnable = [](const std::filesystem::path& path) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) return std::string("no such file");
    if (std::filesystem::is_directory(path, error)) return std::string("it is a directory");
    if (::access(path.c_str(), X_OK) != 0) return fmt::format("not executable ({})", std::strerror(errno));
    return std::string();
  };
  if (program.find('/') != std::string::npos) return runnable(program);
  const char* search = std::getenv("PATH");
  for (std::string_view rest = search != nullptr ? search : "/usr/bin:/bin"; !rest.empty();) {
    const auto colon = rest.find(':');
    const std::string_view directory = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (runnable(std::filesystem::path(directory.empty() ? "." : std::string(directory)) / program).empty()) return {};
  }
  return "not found on PATH";
}

[[noreturn]] void usage(const std::string& problem) {
  fmt::print(stderr, "cohort-launch: {} (run with --help for the options)\n", problem);
  std::exit(2);
}

// The IPv4 address of `host` ("localhost", "10.0.0.5"), as the processes' TF_CONFIG gives it.
std::string ipv4_address_of(const std::string& host) {
  // Loopback by definition (RFC 6761), also where no resolver or /etc/hosts knows it (a bare container).
  if (host == "localhost") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0)
    usage(fmt::format("--host '{}' has no IPv4 address: {}", host, ::gai_strerror(error)));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(found);
  return text;
}

Options parse(int argc, char** argv) {
  Options options;
  // Everything after "--" is the program and its arguments, untouched.
  int separator = 1;
  while (separator < argc && std::string_view(argv[separator]) != "--") ++separator;
  for (int i = separator + 1; i < argc; ++i) options.command.emplace_back(argv[i]);
  CLI::App cli{"Starts a local cluster of one program and watches it.", "cohort-launch"};
  cli.footer("After the options: -- PROGRAM [ARGS...], the program every process runs. Unless OMP_NUM_THREADS is set,\n"
             "the machine's cores are shared among the workers and each parameter server gets one thread.");
  cli.option_defaults()->always_capture_default();
  int grace_seconds = static_cast<int>(options.grace.count());
  cli.add_option("--workers", options.workers, "training processes; the first is the chief")->check(cohort::app::whole_number(1, 1024));
  cli.add_option("--ps", options.ps, "parameter-server processes")->check(cohort::app::whole_number(0, 1024));
  cli.add_option("--gpus", options.gpus,
                 "spread the workers over N GPUs (CUDA_VISIBLE_DEVICES), parameter servers get none; 0 leaves "
                 "CUDA_VISIBLE_DEVICES as it is")
      ->check(cohort::app::whole_number(0, 1024));
  cli.add_option("--host", options.host, "address (or name) every process listens on");
  cli.add_option("--grace", grace_seconds, "after a failure, seconds the others get to exit by themselves")
      ->check(cohort::app::whole_number(0, 3600));
  cli.add_option("--restarts", options.restarts, "after a failure, start the whole job again from its latest checkpoint, "
                                                 "up to N times")
      ->check(cohort::app::whole_number(0, 1024));
  cohort::app::parse_or_exit(cli, separator, argv);
  if (options.command.empty()) usage("no program given after --");
  if (const std::string problem = cannot_run(options.command[0]); !problem.empty())
    usage(fmt::format("cannot run {}: {}", options.command[0], problem));
  options.grace = std::chrono::seconds(grace_seconds);
  options.host = ipv4_address_of(options.host);
  if (options.host == "0.0.0.0")
    usage("--host 0.0.0.0: every process would listen on every interface, and none can dial it; give an address of "
          "this host (the default, 127.0.0.1, keeps the job to this machine)");
  // The processes' settings are the launcher's: a misspelt one is refused here, before any process starts.
  try {
    cohort::check_settings();
  } catch (const std::exception& e) {
    usage(e.what());
  }
  return options;
}

// Free TCP ports on `host`, held open together so that they differ, then released for the processes.
std::vector<int> free_ports(const std::string& host, int count) {
  std::vector<int> sockets, ports;
  for (int i = 0; i < count; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) usage(fmt::format("--host '{}' is not an IPv4 address", host));
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      usage(fmt::format("cannot bind to {}: {}", host, std::strerror(errno)));
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    ports.push_back(ntohs(address.sin_port));
    sockets.push_back(fd);
  }
  for (int fd : sockets) ::close(fd);
  return ports;
}

std::string random_secret() {
  unsigned char bytes[32];
  const int fd = ::open("/dev/urandom", O_RDONLY);
  if (fd < 0 || ::read(fd, bytes, sizeof bytes) != static_cast<ssize_t>(sizeof bytes)) {
    fmt::print(stderr, "cohort-launch: cannot read /dev/urandom for the shared secret\n");
    std::exit(2);
  }
  ::close(fd);
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

std::vector<Process> plan(const Options& options) {
  const std::vector<int> ports = free_ports(options.host, options.workers + options.ps);
  auto list = [&](int first, int count) {
    std::string out;
    for (int i = 0; i < count; ++i) out += fmt::format("{}\"{}:{}\"", i ? ", " : "", options.host, ports[static_cast<std::size_t>(first + i)]);
    return "[" + out + "]";
  };
  std::string cluster = fmt::format("\"chief\": {}", list(0, 1));
  if (options.workers > 1) cluster += fmt::format(", \"worker\": {}", list(1, options.workers - 1));
  if (options.ps > 0) cluster += fmt::format(", \"ps\": {}", list(options.workers, options.ps));
  std::vector<Process> processes;
  auto add = [&](const std::string& type, int index, const std::string& name) {
    Process p;
    p.name = name;
    p.tf_config = fmt::format(R"({{"cluster": {{{}}}, "task": {{"type": "{}", "index": {}}}}})", cluster, type, index);
    processes.push_back(std::move(p));
  };
  add("chief", 0, "chief 0");
  processes.back().worker_index = 0;
  for (int i = 1; i < options.workers; ++i) {
    add("worker", i - 1, fmt::format("worker {}", i - 1));
    processes.back().worker_index = i;
  }
  for (int i = 0; i < options.ps; ++i) add("ps", i, fmt::format("ps {}", i));
  return processes;
}

bool is_parameter_server(const Process& p) { return p.name.rfind("ps", 0) == 0; }

std::string trimmed(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// GPUs the NVIDIA driver lists on this host; -1 when no driver is loaded.
int driver_gpu_count() {
  std::error_code error;
  std::filesystem::directory_iterator gpus("/proc/driver/nvidia/gpus", error);
  if (error) return -1;
  return static_cast<int>(std::distance(gpus, std::filesystem::directory_iterator()));
}

// The launcher's own GPUs: its CUDA_VISIBLE_DEVICES entries (indices, UUIDs or MIG names), or 0..N-1 when
// it is unset. Values that hide every GPU ("", -1, Slurm's NoDevFiles) and lists with empty entries are
// refused: CUDA would stop reading at them.
std::vector<std::string> launcher_gpus(int wanted) {
  std::vector<std::string> gpus;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const int present = driver_gpu_count();
  if (present < 0)
    fmt::print(stderr, "cohort-launch: --gpus {}: no NVIDIA driver is loaded here; the workers get GPUs that may not exist\n",
               wanted);
  if (visible == nullptr) {
    if (present >= 0 && present < wanted)
      usage(fmt::format("--gpus {}: the NVIDIA driver lists {} GPU{} on this host", wanted, present, present == 1 ? "" : "s"));
    for (int i = 0; i < wanted; ++i) gpus.push_back(std::to_string(i));
    return gpus;
  }
  const std::string list = visible;
  for (std::size_t start = 0; start <= list.size();) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    gpus.push_back(trimmed(list.substr(start, comma - start)));
    start = comma + 1;
  }
  for (const std::string& gpu : gpus)
    if (gpu.empty() || gpu == "-1" || gpu == "NoDevFiles")
      usage(fmt::format("--gpus {}: CUDA_VISIBLE_DEVICES='{}' gives this launcher no usable GPU list", wanted, list));
  if (static_cast<int>(gpus.size()) < wanted)
    usage(fmt::format("--gpus {}: CUDA_VISIBLE_DEVICES={} names only {} GPU{}", wanted, list, gpus.size(),
                      gpus.size() == 1 ? "" : "s"));
  gpus.resize(static_cast<std::size_t>(wanted));
  return gpus;
}

// Worker k gets GPU k mod N; parameter servers none. Printed once, so a log shows who used which GPU.
void assign_gpus(std::vector<Process>& processes, int count) {
  if (count == 0) return;
  const std::vector<std::string> gpus = launcher_gpus(count);
  std::string summary;
  std::size_t worker = 0;
  for (Process& p : processes) {
    p.visible_gpus = is_parameter_server(p) ? "" : gpus[worker++ % gpus.size()];
    summary += fmt::format("{}{} -> {}", summary.empty() ? "" : ", ", p.name,
                           p.visible_gpus.empty() ? "no GPU" : "GPU " + p.visible_gpus);
  }
  fmt::print("cohort-launch: {}\n", summary);
}

// Threads for one process of the job, unless the user chose with OMP_NUM_THREADS.
std::string thread_count(const Process& p, const Options& options) {
  if (is_parameter_server(p)) return "1";
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  return std::to_string(std::max(1L, cores / options.workers));
}

// What describes a process's place in a cluster, its secret or its restart: the launcher sets TF_CONFIG,
// COHORT_SECRET and COHORT_RESTART for every process, and another description left in its own environment
// (RANK beside TF_CONFIG, a secret file beside COHORT_SECRET) would make each process refuse to start.
constexpr const char* kLauncherSettings[] = {"TF_CONFIG", "COHORT_SECRET", "COHORT_SECRET_FILE", "COHORT_RESTART"};

std::vector<std::string> replaced_settings() {
  std::vector<std::string> names(std::begin(cohort::cluster::kDescriptionsBesideTfConfig),
                                 std::end(cohort::cluster::kDescriptionsBesideTfConfig));
  names.insert(names.end(), std::begin(kLauncherSettings), std::end(kLauncherSettings));
  return names;
}

// Says once which of them this environment held.
void note_replaced_settings() {
  std::vector<std::string> present;
  for (const std::string& name : replaced_settings())
    if (std::getenv(name.c_str()) != nullptr) present.push_back(name);
  if (!present.empty())
    fmt::print(stderr, "cohort-launch: {} from this environment {} not passed on: the launcher describes the cluster, makes "
                       "its secret and numbers its restarts for every process\n",
               fmt::join(present, ", "), present.size() == 1 ? "is" : "are");
}

void start(Process& p, const Options& options, const std::string& secret, int restart,
           const std::filesystem::path& timeline_parts) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    fmt::print(stderr, "cohort-launch: pipe failed: {}\n", std::strerror(errno));
    std::exit(2);
  }
  p.pid = ::fork();
  if (p.pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    if (p.worker_index == 0 && terminal_output) {
      ::setenv("COHORT_PROGRESS", "bar", 0);
      winsize size{};
      if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > p.name.size() + 3)
        ::setenv("COLUMNS", std::to_string(size.ws_col - p.name.size() - 3).c_str(), 1);  // room for "[chief 0] "
    }
    for (const std::string& name : replaced_settings()) ::unsetenv(name.c_str());
    ::setenv("TF_CONFIG", p.tf_config.c_str(), 1);
    ::setenv("COHORT_SECRET", secret.c_str(), 1);
    ::setenv("COHORT_RESTART", std::to_string(restart).c_str(), 1);
    ::setenv("COHORT_TIMELINE_PARTS", timeline_parts.c_str(), 1);
    ::setenv("OMP_NUM_THREADS", thread_count(p, options).c_str(), 0);
    if (options.gpus > 0) ::setenv("CUDA_VISIBLE_DEVICES", p.visible_gpus.c_str(), 1);
    if (!is_parameter_server(p)) {
      // As torchrun does: a process that picks its GPU by local rank (without --gpus) takes its own.
      ::setenv("LOCAL_RANK", std::to_string(p.worker_index).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.workers).c_str(), 1);
    }
    ::setpgid(0, 0);  // its own process group: a terminal's Ctrl-C goes to the launcher, which decides
    ::signal(SIGPIPE, SIG_DFL);
    std::vector<char*> argv;
    for (const auto& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    std::_Exit(127);
  }
  ::setpgid(p.pid, p.pid);  // also here, so that the group exists before the first signal
  ::close(out[1]);
  ::close(err[1]);
  p.out = {out[0], {}, stdout};
  p.err = {err[0], {}, stderr};
}

// Whether `line` names `name` at `at` as a whole name ("worker 1", not the start of "worker 10").
bool names_at(const std::string& line, const std::string& name, std::size_t at) {
  const std::size_t after = at + name.size();
  return !(after < line.size() && std::isdigit(static_cast<unsigned char>(line[after])));
}

// Whether `line` says at `at`, right after the name of `name` and its address, `what` of it
// ("worker 1 (127.0.0.1:4001) is stuck: ...", "chief 0 (...) left the group").
bool says_at(const std::string& line, const std::string& name, std::size_t at, std::string_view what) {
  if (!names_at(line, name, at)) return false;
  std::size_t after = at + name.size();
  if (line.compare(after, 2, " (") == 0) {
    const std::size_t close = line.find(')', after);
    if (close == std::string::npos) return false;
    after = close + 1;
  }
  return line.compare(after, what.size(), what) == 0;
}

// Where `line` first says that `name` failed ("ps 0 failed: ...", "chief 0 (...) failed: ..."); npos if nowhere.
std::size_t failure_named_at(const std::string& line, const std::string& name) {
  for (std::size_t at = line.find(name); at != std::string::npos; at = line.find(name, at + 1))
    if ((at == 0 || !std::isalnum(static_cast<unsigned char>(line[at - 1]))) && says_at(line, name, at, " failed: ")) return at;
  return std::string::npos;
}

void note(std::vector<std::string>& reporters, const std::string& reporter) {
  if (std::find(reporters.begin(), reporters.end(), reporter) == reporters.end()) reporters.push_back(reporter);
}

// Notes the processes that `reporter`'s line says it lost ("lost worker 1 (...)", "chief 0 (...) left the
// group": a process that failed by itself leaves before its peers give up), could not reach during set-up
// ("... could not connect within 60000 ms to worker 1 (...), ps 0 (...)") or found stuck.
void note_losses(Process& reporter, const std::string& line, std::vector<Process>& processes) {
  const std::size_t unreachable = line.find("could not connect within");
  const bool stuck = line.find(" is stuck") != std::string::npos;
  for (Process& q : processes) {
    if (&q == &reporter) continue;
    // "ps 0 failed: ..." (a server's reply), "chief 0 (127.0.0.1:2222) failed: ..." (a transport's report)
    if (const std::size_t at = failure_named_at(line, q.name); at != std::string::npos) {
      note(q.reported_failed_by, reporter.name);
      note(reporter.failed_because_of, q.name);
      // Failures chain in one line ("chief 0 failed: ps 0 failed: ..."): the first passed on the second's.
      for (Process& earlier : processes)
        if (&earlier != &q && failure_named_at(line, earlier.name) < at) note(earlier.failed_because_of, q.name);
    }
    for (std::size_t at = stuck ? line.find(q.name) : std::string::npos; at != std::string::npos; at = line.find(q.name, at + 1))
      if (says_at(line, q.name, at, " is stuck")) {
        note(q.reported_stuck_by, reporter.name);
        break;
      }
    bool named = false;
    for (std::size_t at = line.find("lost " + q.name); at != std::string::npos && !named; at = line.find("lost " + q.name, at + 1))
      named = names_at(line, q.name, at + 5);
    for (std::size_t at = line.find(q.name); at != std::string::npos && !named; at = line.find(q.name, at + 1))
      named = says_at(line, q.name, at, " left the group");
    for (std::size_t at = unreachable == std::string::npos ? std::string::npos : line.find(q.name, unreachable);
         at != std::string::npos && !named; at = line.find(q.name, at + 1))
      named = names_at(line, q.name, at);
    if (named) note(q.reported_lost_by, reporter.name);
  }
}

// What a terminal would show of a line that redraws itself with carriage returns and erase-to-end.
std::string as_displayed(std::string_view line) {
  if (const std::size_t last = line.rfind('\r'); last != std::string_view::npos) line.remove_prefix(last + 1);
  std::string shown(line);
  for (std::size_t at; (at = shown.find("\x1b[K")) != std::string::npos;) shown.erase(at, 3);
  return shown;
}

void clear_status_line() {
  if (!status_line_shown) return;
  std::fputs("\r\x1b[K", stdout);
  status_line_shown = false;
}

// Writes every whole line `stream` has received, prefixed, to the stream it came on; with flush_partial
// also the rest. A chief's unfinished line that redraws itself (its progress bar) is shown as a status
// line on a terminal.
void print_lines(Process& p, Process::Stream& stream, bool flush_partial, std::vector<Process>& processes) {
  std::FILE* to = stream.to;
  auto emit = [&](std::string_view raw) {
    const std::string line = as_displayed(raw);
    clear_status_line();
    fmt::print(to, "[{}] {}\n", p.name, line);
    note_losses(p, line, processes);
  };
  std::size_t start = 0;
  for (std::size_t newline; (newline = stream.partial.find('\n', start)) != std::string::npos; start = newline + 1)
    emit(std::string_view(stream.partial).substr(start, newline - start));
  stream.partial.erase(0, start);
  if (flush_partial && !stream.partial.empty()) {
    emit(stream.partial);
    stream.partial.clear();
  }
  if (const std::size_t last = stream.partial.rfind('\r'); last != std::string::npos) {
    stream.partial.erase(0, last);  // only the latest redraw matters
    if (terminal_output && to == stdout && p.worker_index == 0) {
      clear_status_line();
      fmt::print(stdout, "[{}] {}", p.name, as_displayed(stream.partial));
      status_line_shown = true;
    }
  }
  std::fflush(to);
  if (to != stdout) std::fflush(stdout);
}

std::string how(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// Signals each running process's whole process group, so that helpers it started stop too; a stopped
// process is continued, so that it can act on the signal.
void signal_all(std::vector<Process>& processes, int number) {
  for (auto& p : processes)
    if (!p.status) {
      ::kill(-p.pid, number);
      if (p.stopped_by) ::kill(-p.pid, SIGCONT);
    }
}

// A process still running that others lost, found stuck, or that is stopped: the likely cause of their
// failures.
bool suspect(const Process& p) {
  return !p.status && (p.stopped_by || !p.reported_lost_by.empty() || !p.reported_stuck_by.empty());
}

// "worker 1 (pid 42) is stopped (signal 19, Stopped (signal)) and was reported lost by chief 0, worker 0";
// "worker 1 (pid 42) is stuck: alive and connected, but making no progress (reported by ps 0, ps 1)"
std::string describe_suspect(const Process& p) {
  std::string out = fmt::format("{} (pid {}) ", p.name, p.pid);
  if (p.stopped_by) out += fmt::format("is stopped (signal {}, {})", *p.stopped_by, strsignal(*p.stopped_by));
  else if (!p.reported_stuck_by.empty())
    return out + fmt::format("is stuck: alive and connected, but making no progress (reported by {})", fmt::join(p.reported_stuck_by, ", "));
  else out += "stopped answering";
  if (!p.reported_lost_by.empty()) out += fmt::format(" and was reported lost by {}", fmt::join(p.reported_lost_by, ", "));
  return out;
}

// 128 + the signal, as a shell reports a process ended by it.
int interrupted_status(int signal) { return 128 + signal; }
constexpr auto kAttributionWindow = std::chrono::milliseconds(500);
constexpr auto kChainedAttributionWindow = std::chrono::seconds(3);
// How long a process may go on alone after every other one has failed before it counts as stuck.
constexpr auto kOutliveWindow = std::chrono::seconds(3);

// "worker 1 (pid 42) was killed by signal 9 (Killed)"
std::string describe_ending(const Process& p) { return fmt::format("{} (pid {}) {}", p.name, p.pid, how(*p.status)); }

// Runs the job once; returns the launcher's exit status.
int run_processes(const Options& options, int restart, const std::filesystem::path& timeline_parts) {
  std::vector<Process> processes = plan(options);
  assign_gpus(processes, options.gpus);
  const std::string secret = random_secret();
  for (auto& p : processes) start(p, options, secret, restart, timeline_parts);
  std::string started;
  for (const auto& p : processes) started += fmt::format("{}{} (pid {})", started.empty() ? "" : ", ", p.name, p.pid);
  fmt::print(stderr, "cohort-launch: started {}\n", started);
  if (restart == 0) note_replaced_settings();
  if (restart == 0 && std::getenv("OMP_NUM_THREADS") == nullptr)
    fmt::print(stderr, "cohort-launch: OMP_NUM_THREADS={} for each worker{} (the cores shared among the workers; set "
                       "OMP_NUM_THREADS to choose)\n",
               thread_count(processes.front(), options), options.ps > 0 ? ", 1 for each parameter server" : "");

  std::optional<std::string> first_failure;       // "worker 1 (pid 42) was killed by signal 9"
  std::vector<std::string> later_failures;
  std::vector<const Process*> undecided;           // failed before a cause was named
  Clock::time_point undecided_since;
  std::optional<Clock::time_point> stop_at, kill_at, alone_since;
  bool interrupted = false;
  int interrupted_by = 0;
  std::vector<std::string> left_running;  // "ps 0 (pid 42)": stopped by the launcher after the grace period
  auto begin_stopping = [&](std::chrono::seconds grace) {
    if (!stop_at) stop_at = Clock::now() + grace;
  };

  for (;;) {
    bool all_exited = true;
    for (const auto& p : processes) all_exited = all_exited && p.status && p.out.fd < 0 && p.err.fd < 0;
    if (all_exited) break;

    std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Process*, Process::Stream*>> readable;
    for (auto& p : processes)
      for (Process::Stream* stream : {&p.out, &p.err})
        if (stream->fd >= 0) {
          fds.push_back({stream->fd, POLLIN, 0});
          readable.emplace_back(&p, stream);
        }
    ::poll(fds.data(), fds.size(), 200);

    unsigned char signals[64];
    for (ssize_t got; (got = ::read(signal_pipe[0], signals, sizeof signals)) > 0;)
      for (ssize_t i = 0; i < got; ++i)
        if (signals[i] == SIGINT || signals[i] == SIGTERM) {
          if (!interrupted) fmt::print(stderr, "cohort-launch: interrupted; stopping all processes\n");
          if (!interrupted) interrupted_by = signals[i];
          interrupted = true;
          signal_all(processes, SIGTERM);
          kill_at = Clock::now() + std::chrono::seconds(5);
        }

    for (std::size_t i = 0; i < readable.size(); ++i) {
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      auto [p, stream] = readable[i];
      char buffer[65536];
      const ssize_t got = ::read(stream->fd, buffer, sizeof buffer);
      if (got > 0) {
        stream->partial.append(buffer, static_cast<std::size_t>(got));
        print_lines(*p, *stream, false, processes);
      } else if (got == 0 || errno != EINTR) {
        print_lines(*p, *stream, true, processes);
        ::close(stream->fd);
        stream->fd = -1;
      }
    }

    // Failed processes, reaped as they end. A process killed by a signal is the likelier cause, but a peer
    // that noticed its loss can exit before the killed one has been torn down and can be reaped: the first
    // failures are weighed together for a short window before one is named as the cause.
    for (auto& p : processes) {
      if (p.status) continue;
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) != p.pid) continue;
      if (WIFSTOPPED(status)) {
        p.stopped_by = WSTOPSIG(status);
        continue;
      }
      if (WIFCONTINUED(status)) {
        p.stopped_by.reset();
        continue;
      }
      p.status = status;
      if (!failed(status) || interrupted || p.killed_as_hung || (stop_at && Clock::now() > *stop_at)) continue;  // or ended by our signals
      if (first_failure) {
        later_failures.push_back(describe_ending(p));
      } else {
        if (undecided.empty()) undecided_since = Clock::now();
        undecided.push_back(&p);
      }
    }
    const bool signaled = std::any_of(undecided.begin(), undecided.end(), [](const Process* p) { return WIFSIGNALED(*p->status); });
    const bool everyone_ended = std::all_of(processes.begin(), processes.end(), [](const Process& p) { return p.status.has_value(); });
    // A failure passed on from a process still running (a server that reported its full disk and is
    // writing its last words) waits a little longer for that process, the cause, to end.
    const bool cause_still_running = std::any_of(undecided.begin(), undecided.end(), [&](const Process* p) {
      return std::any_of(p->failed_because_of.begin(), p->failed_because_of.end(), [&](const std::string& name) {
        return std::any_of(processes.begin(), processes.end(), [&](const Process& q) { return q.name == name && !q.status; });
      });
    });
    const auto undecided_for = Clock::now() - undecided_since;
    if (!undecided.empty() && (signaled || everyone_ended ||
                               undecided_for >= (cause_still_running ? kChainedAttributionWindow : kAttributionWindow))) {
      std::stable_sort(undecided.begin(), undecided.end(), [](const Process* a, const Process* b) {
        return WIFSIGNALED(*a->status) && !WIFSIGNALED(*b->status);
      });
      // A process that failed by itself, having lost a peer that is still there (hung, stopped, cut off),
      // did not cause the failure: the peer did.
      const auto hung = std::find_if(processes.begin(), processes.end(), suspect);
      const bool blame_hung = hung != processes.end() && !WIFSIGNALED(*undecided.front()->status);
      // Likewise one that ended after the others had lost it (a pause that outlasted the peer timeout), and
      // above all one that others report failed with its own reason (a server's full disk).
      if (!blame_hung && !WIFSIGNALED(*undecided.front()->status)) {
        // Losses chain (worker 1 saw worker 0 leave, which had seen the chief leave): the cause is the one
        // lost that lost nobody itself.
        auto reported_a_loss = [&](const Process* p) {
          return std::any_of(processes.begin(), processes.end(), [&](const Process& q) {
            return std::find(q.reported_lost_by.begin(), q.reported_lost_by.end(), p->name) != q.reported_lost_by.end();
          });
        };
        auto lost = std::find_if(undecided.begin(), undecided.end(),
                                 [&](const Process* p) { return !p->reported_lost_by.empty() && !reported_a_loss(p); });
        if (lost == undecided.end())
          lost = std::find_if(undecided.begin(), undecided.end(), [](const Process* p) { return !p->reported_lost_by.empty(); });
        if (lost != undecided.end()) std::rotate(undecided.begin(), lost, lost + 1);
        // Failures chain too (ps 1 reports "chief 0 failed: ps 0 failed: no space"): the cause is the one
        // reported failed that passed on nobody's failure.
        auto failed = std::find_if(undecided.begin(), undecided.end(),
                                   [](const Process* p) { return !p->reported_failed_by.empty() && p->failed_because_of.empty(); });
        if (failed == undecided.end())
          failed = std::find_if(undecided.begin(), undecided.end(), [](const Process* p) { return !p->reported_failed_by.empty(); });
        if (failed != undecided.end()) std::rotate(undecided.begin(), failed, failed + 1);
      }
      const Process& cause = *undecided.front();
      first_failure = blame_hung                         ? describe_suspect(*hung)
                      : WIFSIGNALED(*cause.status)       ? describe_ending(cause)
                      : !cause.reported_failed_by.empty() ? fmt::format("{} (reported failed by {})", describe_ending(cause),
                                                                        fmt::join(cause.reported_failed_by, ", "))
                      : !cause.reported_lost_by.empty()
                          ? fmt::format("{}, the others having lost it before (reported lost by {})", describe_ending(cause),
                                        fmt::join(cause.reported_lost_by, ", "))
                          : describe_ending(cause);
      for (std::size_t i = blame_hung ? 0 : 1; i < undecided.size(); ++i) later_failures.push_back(describe_ending(*undecided[i]));
      undecided.clear();
      fmt::print(stderr, "cohort-launch: {}; the others have {} s to finish\n", *first_failure, options.grace.count());
      begin_stopping(options.grace);
    }

    bool trainers_done = true, trainers_ok = true;
    for (const auto& p : processes)
      if (!is_parameter_server(p)) {
        trainers_done = trainers_done && p.status.has_value();
        trainers_ok = trainers_ok && p.status && !failed(*p.status);
      }
    if (trainers_done && trainers_ok) begin_stopping(options.grace);  // parameter servers end after the trainers
    // Once the chief has succeeded, or every other process has, the rest of the job is done: a process that
    // does not follow within the grace period is stuck (alive, but its program no longer advances).
    const auto succeeded = [](const Process& p) { return p.status && !failed(*p.status); };
    const bool chief_succeeded = std::any_of(processes.begin(), processes.end(),
                                             [&](const Process& p) { return p.name.starts_with("chief") && succeeded(p); });
    const auto unfinished = std::count_if(processes.begin(), processes.end(), [](const Process& p) { return !p.status; });
    const auto successes = std::count_if(processes.begin(), processes.end(), succeeded);
    if (!first_failure && unfinished > 0 && (chief_succeeded || successes + unfinished == static_cast<std::ptrdiff_t>(processes.size())) &&
        successes > 0 && (chief_succeeded || unfinished == 1))
      begin_stopping(options.grace);

    const auto now = Clock::now();
    // Once only the processes the others lost are left, waiting for them is pointless: they are hung.
    const bool only_suspects_left =
        std::none_of(processes.begin(), processes.end(), [](const Process& p) { return !p.status && !suspect(p); });
    // A process that goes on alone once every other one has failed is stuck (alive, its transport too,
    // but its training makes no progress): after a moment it is killed and named as the cause.
    const auto running = std::count_if(processes.begin(), processes.end(), [](const Process& p) { return !p.status; });
    const bool alone_after_failures =
        first_failure && running == 1 && !only_suspects_left &&
        std::all_of(processes.begin(), processes.end(), [](const Process& p) { return !p.status || failed(*p.status); });
    if (!alone_after_failures) alone_since.reset();
    else if (!alone_since) alone_since = now;
    if (alone_after_failures && !kill_at && now - *alone_since >= kOutliveWindow) {
      for (auto& p : processes)
        if (!p.status) {
          fmt::print(stderr, "cohort-launch: killing {} (pid {}): it went on alone after every other process had failed\n", p.name, p.pid);
          ::kill(-p.pid, SIGKILL);
          p.killed_as_hung = true;
          p.outlived_failure = true;
        }
      kill_at = now + std::chrono::hours(1);
    }
    if (first_failure && !kill_at && only_suspects_left) {
      for (auto& p : processes)
        if (!p.status) {
          fmt::print(stderr, "cohort-launch: killing {} (pid {}): every other process has ended\n", p.name, p.pid);
          ::kill(-p.pid, SIGKILL);
          p.killed_as_hung = true;
        }
      kill_at = now + std::chrono::hours(1);
    }
    if (stop_at && now >= *stop_at && !kill_at) {
      for (const auto& p : processes)
        if (!p.status) left_running.push_back(fmt::format("{} (pid {})", p.name, p.pid));
      signal_all(processes, SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    }
    if (kill_at && now >= *kill_at) {
      signal_all(processes, SIGKILL);
      kill_at = now + std::chrono::hours(1);
    }
  }

  if (interrupted) {
    fmt::print(stderr, "cohort-launch: stopped {} processes on request\n", processes.size());
    return interrupted_status(interrupted_by);
  }
  if (first_failure) {
    std::string then;
    // The one that went on alone caused the others' failures, unless the first of them was killed by a signal.
    const auto outlived = std::find_if(processes.begin(), processes.end(), [](const Process& p) { return p.outlived_failure; });
    if (outlived != processes.end() && first_failure->find(" was killed by signal") == std::string::npos) {
      later_failures.insert(later_failures.begin(), *first_failure);
      first_failure = fmt::format("{} (pid {}) is stuck: it went on alone after every other process had failed, and was killed",
                                  outlived->name, outlived->pid);
    }
    for (const auto& f : later_failures) then += (then.empty() ? "; then " : ", ") + f;
    fmt::print(stderr, "cohort-launch: failed: {}{}{}\n", *first_failure, then,
               left_running.empty() ? "" : fmt::format("; stopped {} that did not exit by themselves", left_running.size()));
    return 1;
  }
  if (!left_running.empty()) {
    // Servers serve the trainers: servers still running beside a trainer that never ended wait on it.
    std::vector<std::string> trainers, servers;
    for (const std::string& p : left_running) (p.rfind("ps", 0) == 0 ? servers : trainers).push_back(p);
    if (trainers.empty() || servers.empty()) {
      fmt::print(stderr, "cohort-launch: failed: {} did not exit within {} s after the others finished (stuck?) and {} stopped\n",
                 fmt::join(left_running, ", "), options.grace.count(), left_running.size() == 1 ? "was" : "were");
    } else {
      fmt::print(stderr, "cohort-launch: failed: {} did not exit within {} s after the others finished (stuck?) and {} stopped; "
                 "{}, still waiting for {}, {} stopped too\n",
                 fmt::join(trainers, ", "), options.grace.count(), trainers.size() == 1 ? "was" : "were",
                 fmt::join(servers, ", "), trainers.size() == 1 ? "it" : "them", servers.size() == 1 ? "was" : "were");
    }
    return 1;
  }
  fmt::print(stderr, "cohort-launch: all {} processes succeeded\n", processes.size());
  return 0;
}

// Where the processes of one run leave their timelines (a program run with --timeline FILE) for the
// launcher to merge into FILE, a track per process, whether the run succeeded or not.
class TimelineParts {
 public:
  // The directory is made by the first process that writes a timeline: a job without timelines leaves
  // nothing behind, whatever happens to the launcher.
  TimelineParts() {
    const char* temporary = std::getenv("TMPDIR");
    const std::filesystem::path base = temporary != nullptr && *temporary != '\0' ? temporary : "/tmp";
    directory_ = base / fmt::format("cohort-timeline-{}-{}", ::getpid(), random_secret().substr(0, 12));
  }
  ~TimelineParts() {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
  TimelineParts(const TimelineParts&) = delete;
  TimelineParts& operator=(const TimelineParts&) = delete;

  const std::filesystem::path& directory() const { return directory_; }
  void merge() const {
    std::error_code error;
    if (!std::filesystem::exists(directory_, error)) return;
    const auto report = cohort::timeline::merge_directory(directory_);
    for (const auto& file : report.written) fmt::print(stderr, "cohort-launch: timeline of the job written to {}\n", file.string());
    for (const auto& problem : report.problems) fmt::print(stderr, "cohort-launch: a timeline was left out: {}\n", problem);
  }

 private:
  std::filesystem::path directory_;
};

int run(const Options& options, int restart) {
  const TimelineParts timeline_parts;
  const int status = run_processes(options, restart, timeline_parts.directory());
  timeline_parts.merge();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 2;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int number : {SIGINT, SIGTERM, SIGCHLD}) ::sigaction(number, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  for (int restart = 0;; ++restart) {
    const int status = run(options, restart);
    if (status == 0 || status == interrupted_status(SIGINT) || status == interrupted_status(SIGTERM) ||
        restart >= options.restarts)
      return status;
    fmt::print(stderr, "cohort-launch: restarting the job from its latest checkpoint (restart {} of {})\n", restart + 1,
               options.restarts);
  }
}
