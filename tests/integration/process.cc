#include "process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace psflow::testing {
namespace {

// The directories TempDir made in this process: removed when it exits, unless a test failed (they
// are then kept to look at, and named in its output) or PSFLOW_KEEP_TEST_DIRS is set. Only the
// process that made them removes them (a forked child that exits does not).
struct MadeDirs {
  pid_t owner = getpid();
  std::vector<std::filesystem::path> dirs;
  ~MadeDirs() {
    if (getpid() != owner || std::getenv("PSFLOW_KEEP_TEST_DIRS") != nullptr) return;
    if (::testing::UnitTest::GetInstance()->Failed()) return;
    std::error_code ignored;
    for (const auto& dir : dirs) std::filesystem::remove_all(dir, ignored);
  }
};
MadeDirs& Made() {
  static MadeDirs made;
  return made;
}

}  // namespace

Process::Process(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  static int counter = 0;
  output_path_ = (std::filesystem::temp_directory_path() /
                  ("psflow_proc_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log"))
                     .string();
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(output_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
    for (const std::string& kv : env) putenv(strdup(kv.c_str()));
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
}

Process::~Process() {
  if (!waited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::remove(output_path_.c_str());
}

ProcessResult Process::Wait(double timeout_secs) {
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_secs);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  waited_ = true;
  if (result.timed_out) {
    result.exit_code = -1;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  std::ifstream in(output_path_);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

std::string Process::OutputSoFar() const {
  std::ifstream in(output_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ProcessResult RunProcess(const std::vector<std::string>& args, double timeout_secs,
                         const std::vector<std::string>& env) {
  Process p(args, env);
  return p.Wait(timeout_secs);
}

std::string PsflowBinary() {
  const char* b = std::getenv("PSFLOW_BINARY");  // an override for running a test by hand
  return b ? b : PSFLOW_BINARY_PATH;
}

std::string MnistDir() {
  const char* s = std::getenv("PSFLOW_SOURCE_DIR");
  return std::string(s ? s : ".") + "/data/mnist";
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("psflow_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Made().dirs.push_back(dir);
  return dir.string();
}

std::vector<int> FreePorts(int count) {
  std::vector<int> fds, ports;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

}  // namespace psflow::testing
