// freeze_thread PID: stops the main thread of process PID and nothing else, as a deadlock or an endless
// read would leave a training process: its transport threads go on sending heartbeats, so it is alive and
// connected but makes no progress. Holds it stopped (ptrace's interrupt, which stops one thread) until
// this program is ended; prints "frozen PID" once the thread has stopped.
// freeze_thread --at-exit PID: lets the main thread run until it asks the kernel to end the process
// (exit_group), and holds it there, as a process stuck once its work is done would be: its program has
// finished, the process never ends. Prints "tracing PID" at once and "frozen PID" when it holds it.
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool announce(const char* what, pid_t pid) {
  std::printf("%s %d\n", what, pid);
  return std::fflush(stdout) == 0;
}

// Further stops (a signal for the thread) are held too; the thread leaves only when it is killed.
int hold(pid_t pid) {
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, __WALL) != pid) return 0;
    if (WIFEXITED(status) || WIFSIGNALED(status)) return 0;
  }
}

int freeze_now(pid_t pid) {
  // The main thread's id is the process id; seizing it traces that thread alone.
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, nullptr) != 0 || ::ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) != 0) {
    std::fprintf(stderr, "freeze_thread: cannot stop the main thread of %d: %s\n", pid, std::strerror(errno));
    return 1;
  }
  int status = 0;
  if (::waitpid(pid, &status, __WALL) != pid || !WIFSTOPPED(status)) {
    std::fprintf(stderr, "freeze_thread: %d did not stop\n", pid);
    return 1;
  }
  announce("frozen", pid);
  return hold(pid);
}

#if defined(__x86_64__)
int freeze_at_exit(pid_t pid) {
  const auto options = reinterpret_cast<void*>(static_cast<long>(PTRACE_O_TRACESYSGOOD));
  if (::ptrace(PTRACE_SEIZE, pid, nullptr, options) != 0 || ::ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) != 0) {
    std::fprintf(stderr, "freeze_thread: cannot trace the main thread of %d: %s\n", pid, std::strerror(errno));
    return 1;
  }
  announce("tracing", pid);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, __WALL) != pid || WIFEXITED(status) || WIFSIGNALED(status)) {
      std::fprintf(stderr, "freeze_thread: %d ended before it reached its exit\n", pid);
      return 1;
    }
    long signal = 0;  // what the thread gets when it goes on: a signal meant for it, none after a tracing stop
    const int stop = WSTOPSIG(status);
    if (stop == (SIGTRAP | 0x80)) {  // a system call's entry or exit
      user_regs_struct registers{};
      if (::ptrace(PTRACE_GETREGS, pid, nullptr, &registers) == 0 && registers.orig_rax == SYS_exit_group) {
        announce("frozen", pid);
        return hold(pid);
      }
    } else if (status >> 16 == 0 && stop != SIGTRAP) {
      signal = stop;
    }
    ::ptrace(PTRACE_SYSCALL, pid, nullptr, reinterpret_cast<void*>(signal));
  }
}
#else
int freeze_at_exit(pid_t) {
  std::fprintf(stderr, "freeze_thread: --at-exit reads system calls on x86-64 only\n");
  return 1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const bool at_exit = argc == 3 && std::strcmp(argv[1], "--at-exit") == 0;
  if (argc != 2 && !at_exit) {
    std::fprintf(stderr, "usage: freeze_thread [--at-exit] PID\n");
    return 2;
  }
  const pid_t pid = static_cast<pid_t>(std::atol(argv[argc - 1]));
  return at_exit ? freeze_at_exit(pid) : freeze_now(pid);
}
