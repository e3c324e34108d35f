// loom run: fork/exec per local rank, prefixed output forwarding, stop-all on the first failure.
#include "loom/dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "loom/util/errors.h"

namespace loom::dist {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) { g_stop_signal = signal; }

// A port on this machine that nothing listens on now; the kernel picks it.
int64_t free_local_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw DistributedError(fmt::format("loom run: cannot open a socket: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string reason = std::strerror(errno);
    close(fd);
    throw DistributedError(fmt::format("loom run: cannot find a free port: {}", reason));
  }
  close(fd);
  return ntohs(address.sin_port);
}

// One output stream of one rank: bytes in, whole lines out behind "[rank N] ".
struct Stream {
  int fd = -1;
  FILE* to = nullptr;
  std::string pending;
};

struct Child {
  int64_t rank = 0;
  pid_t pid = -1;
  bool running = true;
  Stream out, err;
};

void emit(int64_t rank, Stream& s, bool flush_partial) {
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    fmt::print(s.to, "[rank {}] {}\n", rank, std::string_view(s.pending).substr(start, nl - start));
  s.pending.erase(0, start);
  if (flush_partial && !s.pending.empty()) {
    fmt::print(s.to, "[rank {}] {}\n", rank, s.pending);
    s.pending.clear();
  }
  std::fflush(s.to);
}

// Reads what is there; closes the stream at end of file.
void drain(int64_t rank, Stream& s) {
  char buffer[8192];
  const ssize_t n = read(s.fd, buffer, sizeof(buffer));
  if (n > 0) {
    s.pending.append(buffer, static_cast<size_t>(n));
    emit(rank, s, false);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    emit(rank, s, true);
    close(s.fd);
    s.fd = -1;
  }
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

int exit_code(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

[[noreturn]] void exec_rank(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::signal(SIGPIPE, SIG_DFL);  // the rank's command starts with the usual disposition, not loom's
  execvp(argv[0], argv.data());
  // `loom run -- loom train ...` with loom not on PATH: this very binary.
  if (errno == ENOENT && std::filesystem::path(command[0]).filename() == "loom")
    execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "loom run: cannot start '%s': %s\n", command[0].c_str(), std::strerror(errno));
  _exit(127);
}

}  // namespace

int launch(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (command.empty())
    throw DistributedError("loom run: no command to run (loom run -n N -- loom train job.yaml)");
  if (o.nproc_per_node < 1)
    throw DistributedError(fmt::format("loom run: -n must be >= 1, got {}", o.nproc_per_node));
  if (o.nnodes < 1) throw DistributedError(fmt::format("loom run: --nnodes must be >= 1, got {}", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw DistributedError(fmt::format("loom run: --node-rank {} is not one of 0..{} (--nnodes {})",
                                       o.node_rank, o.nnodes - 1, o.nnodes));
  if (o.master_port < 0 || o.master_port > 65535)
    throw DistributedError(fmt::format("loom run: --master-port {} is not a TCP port", o.master_port));
  const int64_t port = o.master_port > 0 ? o.master_port : (o.nnodes == 1 ? free_local_port() : 29500);
  const int64_t world = o.nproc_per_node * o.nnodes;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::max<int64_t>(1, static_cast<int64_t>(cores) / o.nproc_per_node);

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const pid_t parent = getpid();
  std::vector<Child> children;
  for (int64_t local = 0; local < o.nproc_per_node; ++local) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw DistributedError(fmt::format("loom run: cannot create pipes: {}", std::strerror(errno)));
    const int64_t rank = o.node_rank * o.nproc_per_node + local;
    const pid_t pid = fork();
    if (pid < 0) throw DistributedError(fmt::format("loom run: cannot fork: {}", std::strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher gone: no orphaned ranks
      if (getppid() != parent) _exit(1);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
      setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      // The node's cores shared out, unless the user chose (as torchrun does).
      setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 0);
      exec_rank(command);
    }
    close(out[1]);
    close(err[1]);
    Child child;
    child.rank = rank;
    child.pid = pid;
    child.out = {out[0], stdout, {}};
    child.err = {err[0], stderr, {}};
    children.push_back(std::move(child));
  }

  int result = 0;
  bool stopping = false;
  Clock::time_point kill_at;
  auto stop_others = [&] {
    stopping = true;
    kill_at = Clock::now() + std::chrono::seconds(o.stop_grace_s);
    for (const Child& c : children)
      if (c.running) {
        kill(c.pid, SIGTERM);
        kill(c.pid, SIGCONT);  // a stopped rank (SIGSTOP, a debugger) takes its SIGTERM now
      }
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    for (Child& c : children)
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&c, s);
        }
    const bool any_running =
        std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; });
    if (fds.empty() && !any_running) break;
    if (!fds.empty()) {
      if (poll(fds.data(), fds.size(), 200) > 0)
        for (size_t i = 0; i < fds.size(); ++i)
          if (fds[i].revents != 0) drain(owners[i].first->rank, *owners[i].second);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || (stopping && result != 0)) continue;
      result = exit_code(status);
      fmt::print(stderr, "loom run: rank {} (pid {}) {}; stopping the other ranks\n", c.rank, c.pid,
                 describe_status(status));
      stop_others();
    }
    if (g_stop_signal != 0 && !stopping) {
      fmt::print(stderr, "loom run: got signal {}; stopping every rank\n", static_cast<int>(g_stop_signal));
      result = 128 + g_stop_signal;
      stop_others();
    }
    if (stopping && Clock::now() > kill_at)
      for (const Child& c : children)
        if (c.running) kill(c.pid, SIGKILL);
  }
  return result;
}

}  // namespace loom::dist
