// freeze_thread PID: stops the main thread of process PID and nothing else, as a deadlock or an endless
// read would leave a training process: its transport threads go on sending heartbeats, so it is alive and
// connected but makes no progress. Holds it stopped (ptrace's interrupt, which stops one thread) until
// this program is ended; prints "frozen PID" once the thread has stopped.
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: freeze_thread PID\n");
    return 2;
  }
  const pid_t pid = static_cast<pid_t>(std::atol(argv[1]));
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
  std::printf("frozen %d\n", pid);
  std::fflush(stdout);
  // Further stops (a signal for the thread) are held too; the thread leaves only when it is killed.
  for (;;) {
    if (::waitpid(pid, &status, __WALL) != pid) return 0;
    if (WIFEXITED(status) || WIFSIGNALED(status)) return 0;
  }
}
