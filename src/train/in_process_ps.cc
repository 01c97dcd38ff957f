// A worker session's own ps task when it runs alone (in_process_ps.h).
#include "train/in_process_ps.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace psflow::train {
namespace {

// `count` distinct ports the kernel reports free on 127.0.0.1 (every socket stays open until all
// are chosen). A task that then fails to bind one says so.
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError(
          absl::StrCat("no free port on 127.0.0.1 for the in-process ps task: ", std::strerror(errno)));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

}  // namespace

bool InProcessPs::Wanted(const TrainOptions& o) {
  const char* tf_config = std::getenv("TF_CONFIG");
  return o.job_name.empty() && o.ps_hosts.empty() && o.worker_hosts.empty() && o.slurm_jobs.empty() &&
         (tf_config == nullptr || *tf_config == '\0');
}

bool InProcessPs::PortTaken(const absl::Status& start_error) {
  // The gRPC server's bind failure (rpc/grpc_transport.cc), as the ps task returns it.
  return absl::IsUnavailable(start_error) && absl::StrContains(start_error.message(), "cannot listen on ");
}

absl::StatusOr<std::unique_ptr<InProcessPs>> InProcessPs::Make(TrainOptions* worker, LogSink log) {
  auto ports = FreeLoopbackPorts(2);
  if (!ports.ok()) return ports.status();
  worker->ps_hosts = absl::StrCat("127.0.0.1:", (*ports)[0]);
  worker->worker_hosts = absl::StrCat("127.0.0.1:", (*ports)[1]);
  worker->job_name = "worker";
  worker->task_index = 0;
  if (auto s = ResolveTrainOptions(worker); !s.ok()) return s;
  TrainOptions ps = *worker;
  ps.job_name = "ps";
  ps.metrics_port = 0;  // the worker's session serves --metrics_port
  if (auto s = ResolveTrainOptions(&ps); !s.ok()) return s;
  return std::unique_ptr<InProcessPs>(new InProcessPs(std::move(ps), (*ports)[0], std::move(log)));
}

InProcessPs::InProcessPs(TrainOptions ps, int port, LogSink log)
    : ps_options_(std::move(ps)), port_(port), log_(std::move(log)) {
  control_.tf_config = "";  // the cluster is the options' (no $TF_CONFIG, no Slurm step)
}

InProcessPs::~InProcessPs() { Stop(); }

absl::Status InProcessPs::Start(double timeout_secs) {
  if (thread_.joinable()) return absl::FailedPreconditionError("the in-process ps task is already started");
  thread_ = std::thread([this] {
    result_ = RunParameterServer(ps_options_, log_, &control_);
    ended_ = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_secs);
  while (!control_.serving.load()) {
    if (ended_.load()) {
      thread_.join();
      return result_.ok() ? absl::UnavailableError("the in-process ps task ended before serving") : result_;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("the in-process ps task did not serve on 127.0.0.1:", port_, " within ", timeout_secs, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::OkStatus();
}

absl::Status InProcessPs::Join() {
  if (thread_.joinable()) thread_.join();
  return result_;
}

void InProcessPs::Stop() {
  if (!thread_.joinable()) return;
  control_.stop = true;
  thread_.join();
}

}  // namespace psflow::train
