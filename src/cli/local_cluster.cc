#include "cli/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "train/training_end.h"

namespace psflow::cli {
namespace {

// The signal (SIGINT or SIGTERM) that interrupted the launcher, and how many arrived: a second
// Ctrl-C kills the tasks at once instead of waiting for them to stop.
std::atomic<int> g_interrupted{0};
std::atomic<int> g_interrupt_count{0};
void OnSignal(int sig) {
  g_interrupted = sig;
  ++g_interrupt_count;
}

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
  std::atomic<bool> eof{false};  // set by the reader when the task's output ended
  bool done = false;
  int status = 0;
  std::chrono::steady_clock::time_point reaped_at;
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

// Serializes the tasks' reader threads' writes to stdout, and guards the summary line they find.
absl::Mutex g_out_mu;
std::string g_summary_json ABSL_GUARDED_BY(g_out_mu);  // the chief's "summary_json: {...}" line, for the closing table

// Writes one task's line. On a terminal, progress lines ("step N/M ...") of the chief replace
// each other as one live line, and other workers' progress lines are left out (the chief's
// global step covers them); elsewhere every line is printed whole.
void EmitLine(const std::string& prefix, std::string_view line) {
  static const bool tty = isatty(STDOUT_FILENO);
  absl::MutexLock lock(&g_out_mu);
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

void PumpLines(int fd, const std::string& prefix, std::atomic<bool>* eof) {
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
  *eof = true;
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

// A child to start: its argv (argv[0] looked up in PATH) and its whole environment, both built
// before fork so that the child only calls async-signal-safe functions until exec.
struct Command {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V"
};

// The launcher's environment with `set` ("K=V") replacing any entry of the same name.
std::vector<std::string> EnvironmentWith(const std::vector<std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool replaced = false;
    for (const std::string& s : set) {
      if (kv.substr(0, kv.find('=') + 1) == std::string_view(s).substr(0, s.find('=') + 1)) replaced = true;
    }
    if (!replaced) env.emplace_back(kv);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

// Starts `command` with stdout and stderr on a new pipe (returned in *out_fd) and stdin on
// /dev/null, in its own process group (so a terminal's Ctrl-C reaches only the launcher, which
// then stops every task in order), and killed by the kernel if the launcher dies.
pid_t Spawn(const Command& command, int* out_fd) {
  std::vector<char*> argv, envp;
  for (const std::string& a : command.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : command.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_error = "psflow local: cannot start " + command.argv[0] + ": ";
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // The death signal follows the launcher's thread that forked: the main thread, which waits
    // for every child. A launcher that died before prctl took effect is caught by getppid().
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(1);
    setpgid(0, 0);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const char* reason = strerror(errno);
    [[maybe_unused]] ssize_t w = write(STDERR_FILENO, exec_error.data(), exec_error.size());
    w = write(STDERR_FILENO, reason, strlen(reason));
    w = write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  close(pipe_fds[1]);
  if (pid < 0) {
    close(pipe_fds[0]);
    return -1;
  }
  setpgid(pid, pid);  // also here, so that killpg() works before the child got to it
  *out_fd = pipe_fds[0];
  return pid;
}

// Signals a task's whole process group (the task and anything it started that stayed in it).
void Signal(const Child& c, int sig) {
  if (kill(-c.pid, sig) != 0) kill(c.pid, sig);
}

// The tasks' addresses on 127.0.0.1, one free port each.
struct Addresses {
  std::vector<std::string> ps, workers;
  std::string ps_hosts, worker_hosts;  // comma-joined, as the flags take them
};

Addresses AssignAddresses(const LocalClusterOptions& options) {
  const std::vector<int> ports = FreePorts(options.num_ps + options.num_workers);
  Addresses a;
  for (int i = 0; i < options.num_ps; ++i) a.ps.push_back(absl::StrCat("127.0.0.1:", ports[i]));
  for (int i = 0; i < options.num_workers; ++i)
    a.workers.push_back(absl::StrCat("127.0.0.1:", ports[options.num_ps + i]));
  a.ps_hosts = absl::StrJoin(a.ps, ",");
  a.worker_hosts = absl::StrJoin(a.workers, ",");
  return a;
}

// Says what runs where; with an evaluator, clears an earlier run's end marker (which would end it
// at once). False when that fails.
bool Announce(const LocalClusterOptions& options, const Addresses& a) {
  std::cout << "psflow local: ps " << a.ps_hosts << "; workers " << a.worker_hosts << std::endl;
  if (!options.worker_command.empty()) {
    std::cout << "psflow local: the workers run: " << absl::StrJoin(options.worker_command, " ") << std::endl;
  }
  if (!options.evaluator) return true;
  std::cout << "psflow local: an evaluator reads the checkpoints of " << options.checkpoint_dir << std::endl;
  if (absl::Status s = train::ClearTrainingEnd(options.checkpoint_dir); !s.ok()) {
    std::cerr << "psflow local: " << s.message() << std::endl;
    return false;
  }
  return true;
}

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Task i's command: ps tasks first, then workers, then the evaluator (when asked for).
class TaskCommands {
 public:
  TaskCommands(const LocalClusterOptions& options, const Addresses& addresses)
      : options_(options), a_(addresses), python_unbuffered_set_(std::getenv("PYTHONUNBUFFERED") != nullptr) {
    const std::string threads = absl::StrCat(options.intra_op_threads);
    thread_env_ = {"OMP_NUM_THREADS=" + threads, "OPENBLAS_NUM_THREADS=" + threads, "MKL_NUM_THREADS=" + threads};
  }

  int count() const { return options_.num_ps + options_.num_workers + (options_.evaluator ? 1 : 0); }
  bool is_ps(int i) const { return i < options_.num_ps; }
  bool is_evaluator(int i) const { return i == options_.num_ps + options_.num_workers; }
  int index(int i) const { return is_ps(i) ? i : i - options_.num_ps; }
  std::string name(int i) const {
    return is_evaluator(i) ? "evaluator" : absl::StrCat(is_ps(i) ? "ps" : "worker", index(i));
  }

  Command For(int i) const {
    // The evaluator reads checkpoints only: no cluster, no metrics port.
    if (is_evaluator(i)) {
      if (options_.worker_command.empty()) return Psflow({"--job_name=evaluator"}, -1);
      return Program(WorkerTfConfig(a_.ps, a_.workers, 0, "evaluator"), -1);
    }
    if (is_ps(i) || options_.worker_command.empty()) {
      return Psflow({absl::StrCat("--job_name=", is_ps(i) ? "ps" : "worker"), absl::StrCat("--task_index=", index(i)),
                     "--ps_hosts=" + a_.ps_hosts, "--worker_hosts=" + a_.worker_hosts},
                    i);
    }
    return Program(WorkerTfConfig(a_.ps, a_.workers, index(i)), i);
  }

 private:
  // `psflow train` with the role flags, the given flags, and task i's metrics port (i >= 0).
  Command Psflow(std::vector<std::string> role, int i) const {
    Command command;
    command.argv = {options_.binary, "train"};
    command.argv.insert(command.argv.end(), role.begin(), role.end());
    command.argv.insert(command.argv.end(), options_.train_flags.begin(), options_.train_flags.end());
    if (i >= 0 && options_.metrics_port > 0)
      command.argv.push_back(absl::StrCat("--metrics_port=", options_.metrics_port + i));
    command.env = EnvironmentWith(thread_env_);
    return command;
  }
  // The worker's own program: its cluster and role through TF_CONFIG, the train flags through
  // PSFLOW_FLAGS, and Python's output unbuffered so that the merged log interleaves as it happens.
  Command Program(const std::string& tf_config, int i) const {
    Command command;
    command.argv = options_.worker_command;
    nlohmann::json flags = options_.train_flags;
    if (i >= 0 && options_.metrics_port > 0)
      flags.push_back(absl::StrCat("--metrics_port=", options_.metrics_port + i));
    std::vector<std::string> env = {"TF_CONFIG=" + tf_config, "PSFLOW_FLAGS=" + flags.dump()};
    if (!python_unbuffered_set_) env.push_back("PYTHONUNBUFFERED=1");
    env.insert(env.end(), thread_env_.begin(), thread_env_.end());
    command.env = EnvironmentWith(env);
    return command;
  }

  const LocalClusterOptions& options_;
  const Addresses& a_;
  const bool python_unbuffered_set_;
  std::vector<std::string> thread_env_;
};

// Kills and reaps the tasks started so far (one could not be started).
void KillStarted(std::vector<Child>& children) {
  for (Child& started : children) {
    if (started.pid > 0) Signal(started, SIGKILL);
  }
  for (Child& started : children) {
    if (started.pid > 0) waitpid(started.pid, nullptr, 0);
    if (started.reader.joinable()) started.reader.join();
  }
}

// Starts every task with a thread pumping its output; false (every started task killed) when one
// cannot be started.
bool StartAll(const TaskCommands& commands, std::vector<Child>& children) {
  for (int i = 0; i < commands.count(); ++i) {
    Child& c = children[i];
    c.name = commands.name(i);
    c.pid = Spawn(commands.For(i), &c.out_fd);
    if (c.pid < 0) {
      std::cerr << "psflow local: cannot start " << c.name << ": " << strerror(errno) << std::endl;
      KillStarted(children);
      return false;
    }
    c.reader = std::thread(PumpLines, c.out_fd, "[" + c.name + "] ", &c.eof);
  }
  return true;
}

// Waits for every task; on the first failure (or the user's interruption) stops the rest: SIGTERM,
// then SIGKILL after 5 s or a second Ctrl-C.
class Supervisor {
 public:
  explicit Supervisor(std::vector<Child>& children) : children_(children), remaining_(children.size()) {}

  void Run() {
    while (remaining_ > 0) {
      // An interruption is seen before any task's status, so that the tasks we then stop are not
      // reported as failures.
      if (!stopping_ && g_interrupted != 0) OnInterrupted();
      if (stopping_ && !killed_ &&
          (g_interrupt_count > 1 || std::chrono::steady_clock::now() - stop_started_ > std::chrono::seconds(5))) {
        killed_ = true;
        StopAll(SIGKILL);
      }
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        Reaped(pid, status);
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int worst() const { return worst_; }
  int interrupted_by() const { return interrupted_by_; }  // the signal, when the user interrupted the run

 private:
  void StopAll(int sig) {
    for (Child& c : children_) {
      if (!c.done) Signal(c, sig);
    }
  }
  void StartStopping() {
    stopping_ = true;
    stop_started_ = std::chrono::steady_clock::now();
    StopAll(SIGTERM);
  }
  void OnInterrupted() {
    interrupted_by_ = g_interrupted;
    StartStopping();
    absl::MutexLock lock(&g_out_mu);
    std::cout << "\npsflow local: interrupted (" << (interrupted_by_ == SIGINT ? "Ctrl-C" : strsignal(interrupted_by_))
              << "); stopping every task" << std::endl;
  }
  void Reaped(pid_t pid, int status) {
    for (Child& c : children_) {
      if (c.pid != pid) continue;
      c.done = true;
      c.status = status;
      c.reaped_at = std::chrono::steady_clock::now();
      --remaining_;
      // Tasks we stopped ourselves do not hide the status of the one that failed first.
      if (stopping_) continue;
      worst_ = std::max(worst_, ExitCode(status));
      if (ExitCode(status) == 0) continue;
      StartStopping();
      // The failed task's last lines (its error) come before the launcher's verdict.
      while (!c.eof && std::chrono::steady_clock::now() - c.reaped_at < std::chrono::seconds(1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      absl::MutexLock lock(&g_out_mu);
      std::cout << "psflow local: " << c.name << " " << Describe(status) << "; stopping the other tasks" << std::endl;
    }
  }

  std::vector<Child>& children_;
  size_t remaining_;
  int worst_ = 0, interrupted_by_ = 0;
  bool stopping_ = false, killed_ = false;
  std::chrono::steady_clock::time_point stop_started_ = std::chrono::steady_clock::now();
};

// A task's output ends when the last process holding its pipe exits: anything it started and left
// behind in its process group is stopped after 2 s.
void JoinOutputs(std::vector<Child>& children) {
  for (Child& c : children) {
    while (!c.eof && std::chrono::steady_clock::now() - c.reaped_at < std::chrono::seconds(2)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!c.eof) kill(-c.pid, SIGKILL);
    c.reader.join();
  }
}

// The closing lines and the launcher's exit status.
int Verdict(const Supervisor& run) {
  if (run.interrupted_by() != 0) {
    std::cout << "psflow local: interrupted by the user (" << strsignal(run.interrupted_by())
              << "); every task stopped; exit status " << 128 + run.interrupted_by() << std::endl;
    return 128 + run.interrupted_by();
  }
  std::string summary_json;
  {
    absl::MutexLock lock(&g_out_mu);
    summary_json = g_summary_json;
  }
  const int worst = run.worst();
  if (worst == 0 && !summary_json.empty()) PrintTrafficTable(summary_json);
  std::cout << "psflow local: " << (worst == 0 ? "all tasks exited 0" : absl::StrCat("worst exit status ", worst))
            << std::endl;
  return worst;
}

}  // namespace

std::string WorkerTfConfig(const std::vector<std::string>& ps, const std::vector<std::string>& workers, int index,
                           const std::string& type) {
  nlohmann::json config = {{"cluster", {{"ps", ps}, {"worker", workers}}},
                           {"task", {{"type", type}, {"index", index}}}};
  return config.dump();
}

int RunLocalCluster(const LocalClusterOptions& options) {
  const Addresses addresses = AssignAddresses(options);
  if (!Announce(options, addresses)) return 1;
  InstallSignalHandlers();
  const TaskCommands commands(options, addresses);
  std::vector<Child> children(commands.count());
  if (!StartAll(commands, children)) return 1;
  Supervisor run(children);
  run.Run();
  JoinOutputs(children);
  return Verdict(run);
}

}  // namespace psflow::cli
