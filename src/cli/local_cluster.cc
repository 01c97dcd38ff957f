#include "cli/local_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace psflow::cli {
namespace {

std::atomic<int> g_interrupted{0};
void OnSignal(int sig) { g_interrupted = sig; }

// Ports the kernel reports free on 127.0.0.1. All sockets stay open until every port is chosen,
// so the ports are distinct; a task that then fails to bind says so and the run stops.
std::vector<int> FreePorts(int count) {
  std::vector<int> fds, ports;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      perror("psflow local: cannot find a free port on 127.0.0.1");
      std::exit(1);
    }
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

struct Child {
  std::string name;
  pid_t pid = -1;
  int out_fd = -1;
  std::thread reader;
  bool done = false;
  int status = 0;
};

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return "ended in an unknown way";
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::mutex g_out_mu;
std::string g_summary_json;  // the chief's "summary_json: {...}" line, for the closing table

// Writes one task's line. On a terminal, progress lines ("step N/M ...") of the chief replace
// each other as one live line, and other workers' progress lines are left out (the chief's
// global step covers them); elsewhere every line is printed whole.
void EmitLine(const std::string& prefix, std::string_view line) {
  static const bool tty = isatty(STDOUT_FILENO);
  std::lock_guard<std::mutex> lock(g_out_mu);
  if (line.starts_with("summary_json: ")) g_summary_json = std::string(line.substr(14));
  const bool progress = line.starts_with("step ");
  if (!tty) {
    std::cout << prefix << line << "\n" << std::flush;
  } else if (progress) {
    if (prefix == "[worker0] ") std::cout << "\r\x1b[2K" << prefix << line << std::flush;
  } else {
    std::cout << "\r\x1b[2K" << prefix << line << "\n" << std::flush;
  }
}

void PumpLines(int fd, const std::string& prefix) {
  std::string pending;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    pending.append(buf, n);
    size_t start = 0, nl;
    while ((nl = pending.find_first_of("\r\n", start)) != std::string::npos) {
      std::string_view line(pending.data() + start, nl - start);
      // A child on our pty-less pipe never writes \r; strip its terminal codes defensively.
      if (!line.empty()) EmitLine(prefix, line);
      start = nl + 1;
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) EmitLine(prefix, pending);
  close(fd);
}

// The seeds' balance chart in text: per ps task, parameters held, bytes in and out, share.
void PrintTrafficTable(const std::string& summary_json) {
  auto j = nlohmann::json::parse(summary_json, nullptr, false);
  if (!j.is_object() || !j.contains("ps_traffic")) return;
  double total = 0;
  for (const auto& t : j["ps_traffic"]) total += t["bytes_in"].get<double>() + t["bytes_out"].get<double>();
  std::cout << absl::StrFormat("%-8s %14s %16s %16s %8s\n", "ps task", "parameters", "bytes in", "bytes out", "share");
  for (const auto& t : j["ps_traffic"]) {
    const double bytes = t["bytes_in"].get<double>() + t["bytes_out"].get<double>();
    std::cout << absl::StrFormat("%-8d %14d %16d %16d %7.1f%%\n", t["task"].get<int>(), t["num_params"].get<int64_t>(),
                                 t["bytes_in"].get<int64_t>(), t["bytes_out"].get<int64_t>(),
                                 total > 0 ? 100.0 * bytes / total : 0.0);
  }
}

pid_t Spawn(const std::string& binary, const std::vector<std::string>& args, int* out_fd) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    perror(("psflow local: cannot start " + binary).c_str());
    _exit(127);
  }
  close(pipe_fds[1]);
  *out_fd = pipe_fds[0];
  return pid;
}

}  // namespace

int RunLocalCluster(const LocalClusterOptions& options) {
  const std::vector<int> ports = FreePorts(options.num_ps + options.num_workers);
  std::vector<std::string> ps, workers;
  for (int i = 0; i < options.num_ps; ++i) ps.push_back(absl::StrCat("127.0.0.1:", ports[i]));
  for (int i = 0; i < options.num_workers; ++i) workers.push_back(absl::StrCat("127.0.0.1:", ports[options.num_ps + i]));
  const std::string ps_hosts = absl::StrJoin(ps, ","), worker_hosts = absl::StrJoin(workers, ",");
  std::cout << "psflow local: ps " << ps_hosts << "; workers " << worker_hosts << std::endl;

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::vector<Child> children(options.num_ps + options.num_workers);
  for (size_t i = 0; i < children.size(); ++i) {
    const bool is_ps = static_cast<int>(i) < options.num_ps;
    const int index = is_ps ? i : i - options.num_ps;
    Child& c = children[i];
    c.name = absl::StrCat(is_ps ? "ps" : "worker", index);
    std::vector<std::string> args = {"train", absl::StrCat("--job_name=", is_ps ? "ps" : "worker"),
                                     absl::StrCat("--task_index=", index), "--ps_hosts=" + ps_hosts,
                                     "--worker_hosts=" + worker_hosts};
    args.insert(args.end(), options.train_flags.begin(), options.train_flags.end());
    if (options.metrics_port > 0) args.push_back(absl::StrCat("--metrics_port=", options.metrics_port + i));
    c.pid = Spawn(options.binary, args, &c.out_fd);
    if (c.pid < 0) {
      std::cerr << "psflow local: cannot start " << c.name << ": " << strerror(errno) << std::endl;
      return 1;
    }
    c.reader = std::thread(PumpLines, c.out_fd, "[" + c.name + "] ");
  }

  // Wait for every task; on the first failure (or our own interruption) stop the rest.
  int worst = 0;
  size_t remaining = children.size();
  bool stopping = false;
  auto stop_started = std::chrono::steady_clock::now();
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (Child& c : children) {
        if (c.pid != pid) continue;
        c.done = true;
        c.status = status;
        --remaining;
        // Tasks we stopped ourselves do not hide the status of the one that failed first.
        if (!stopping) worst = std::max(worst, ExitCode(status));
        if (ExitCode(status) != 0 && !stopping) {
          stopping = true;
          stop_started = std::chrono::steady_clock::now();
          for (Child& other : children) if (!other.done) kill(other.pid, SIGTERM);
          std::lock_guard<std::mutex> lock(g_out_mu);
          std::cout << "psflow local: " << c.name << " " << Describe(status) << "; stopping the other tasks"
                    << std::endl;
        }
      }
      continue;
    }
    // A failing task starts the stop where it is reaped (above); here only our own interruption.
    if (!stopping && g_interrupted) {
      stopping = true;
      stop_started = std::chrono::steady_clock::now();
      for (Child& c : children) if (!c.done) kill(c.pid, SIGTERM);
    }
    if (stopping && std::chrono::steady_clock::now() - stop_started > std::chrono::seconds(5)) {
      for (Child& c : children) if (!c.done) kill(c.pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children) c.reader.join();
  if (worst == 0 && !g_summary_json.empty()) PrintTrafficTable(g_summary_json);
  if (g_interrupted && worst == 0) worst = 128 + g_interrupted;
  std::cout << "psflow local: " << (worst == 0 ? "all tasks exited 0" : absl::StrCat("worst exit status ", worst))
            << std::endl;
  return worst;
}

}  // namespace psflow::cli
