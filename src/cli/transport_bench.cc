// The transport benchmark, `psflow bench transport` (cli/transport_bench.h).
#include "cli/transport_bench.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/transport_bench_internal.h"
#include "ps/common/wire_config.h"
#include "psflow/dist/cluster.h"
#include "psflow/dist/partition.h"
#include "psflow/ps/ps_client.h"
#include "rpc/transport.h"

extern char** environ;

namespace psflow::cli {
namespace {

using rpc::CallOptions;
using rpc::ClientChannel;
using rpc::IncomingMessage;
using rpc::MakeGrpcChannel;
using rpc::Method;
using rpc::OutgoingMessage;
using rpc::TransportOptions;

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Measurement {
  double gbps = 0;        // bytes moved per second over all repeats, in 1e9 bytes/s
  double latency_ms = 0;  // median call time
};

// Calls of one kind (TCP, push or pull) timed in many short rounds interleaved with the other
// kinds', so load from elsewhere on the (shared) machine hits all of them alike.
class Timings {
 public:
  template <typename Fn>
  absl::Status Run(int calls, Fn&& call) {
    for (int i = 0; i < calls; ++i) {
      const auto t0 = Clock::now();
      if (absl::Status s = call(); !s.ok()) return s;
      times_.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      total_ += times_.back();
    }
    return absl::OkStatus();
  }
  double total_secs() const { return total_; }
  size_t calls() const { return times_.size(); }
  // Throughput over every call's time, and the median call.
  Measurement Of(int64_t bytes) const {
    Measurement m;
    m.gbps = static_cast<double>(bytes) * static_cast<double>(times_.size()) / total_ / 1e9;
    m.latency_ms = Median(times_) * 1e3;
    return m;
  }

 private:
  std::vector<double> times_;
  double total_ = 0;
};

// Runs the kinds of call (TCP, push, pull, ...) in rounds of about kRoundSecs each, one kind after
// another in every round, until each kind ran for about `seconds` (at least 10 calls each, after 3
// warm-up calls each). timings[k] receives calls[k]'s.
absl::Status MeasureInterleaved(double seconds, const std::vector<std::function<absl::Status()>>& calls,
                                std::vector<Timings>* timings) {
  constexpr double kRoundSecs = 0.02;
  timings->assign(calls.size(), Timings());
  for (int i = 0; i < 3; ++i) {
    for (const auto& call : calls) {
      if (absl::Status s = call(); !s.ok()) return s;
    }
  }
  // Calls per round for each kind, from the first round's single calls.
  std::vector<int> per_round(calls.size(), 1);
  auto enough = [&] {
    for (const Timings& t : *timings) {
      if (t.calls() < 10 || t.total_secs() < seconds) return false;
    }
    return true;
  };
  while (!enough()) {
    for (size_t k = 0; k < calls.size(); ++k) {
      if (absl::Status s = (*timings)[k].Run(per_round[k], calls[k]); !s.ok()) return s;
    }
    for (size_t k = 0; k < calls.size(); ++k) {
      const Timings& t = (*timings)[k];
      const double each = t.total_secs() / static_cast<double>(std::max<size_t>(t.calls(), 1));
      per_round[k] = static_cast<int>(std::clamp(kRoundSecs / std::max(each, 1e-9), 1.0, 10000.0));
    }
  }
  return absl::OkStatus();
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The child's TCP sink: for each message ([u64 size][size bytes]) reply one byte, until EOF.
[[noreturn]] void RunTcpSink(int listen_fd, std::vector<char>& buffer) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  if (fd < 0) _exit(1);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  for (;;) {
    uint64_t size = 0;
    if (!ReadAll(fd, &size, sizeof(size)) || size > buffer.size()) _exit(0);
    if (!ReadAll(fd, buffer.data(), size)) _exit(0);
    const char ack = 1;
    if (!WriteAll(fd, &ack, 1)) _exit(0);
  }
}

// Raw TCP between this process and a forked child on loopback: the child reads each message
// ([u64 size][size bytes]) and answers one byte, like a ps answering a push.
class TcpBaseline {
 public:
  // Forks the child; call before this process starts gRPC's threads.
  absl::Status Start(int64_t max_size) {
    buffer_.assign(static_cast<size_t>(max_size), 'x');  // allocated before forking
    const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listen_fd < 0 || ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd, 1) != 0 || ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return absl::InternalError(absl::StrCat("TCP baseline: cannot listen on 127.0.0.1: ", std::strerror(errno)));
    }
    child_ = ::fork();
    if (child_ < 0) return absl::InternalError(absl::StrCat("TCP baseline: fork failed: ", std::strerror(errno)));
    if (child_ == 0) RunTcpSink(listen_fd, buffer_);
    ::close(listen_fd);
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::InternalError(absl::StrCat("TCP baseline: cannot connect: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  // One message of `size` bytes and its one-byte answer.
  absl::Status Call(int64_t size) {
    const uint64_t n = static_cast<uint64_t>(size);
    char ack = 0;
    if (!WriteAll(fd_, &n, sizeof(n)) || !WriteAll(fd_, buffer_.data(), n) || !ReadAll(fd_, &ack, 1)) {
      return absl::InternalError("TCP baseline: the sink closed the connection");
    }
    return absl::OkStatus();
  }

  ~TcpBaseline() {
    if (fd_ >= 0) ::close(fd_);  // the child exits at EOF
    if (child_ > 0) {
      int status = 0;
      ::waitpid(child_, &status, 0);
    }
  }

 private:
  std::vector<char> buffer_;
  pid_t child_ = -1;
  int fd_ = -1;
};

}  // namespace

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

namespace {

// The ps task under test: its cluster (so the client passes its cluster check) and its index.
struct PsTarget {
  dist::ClusterSpec cluster;
  int ps_index = 0;
};

// The cluster the ps's Hello names ("ps=a:1,b:2;worker=c:3"), or, when it names none, one of this
// ps alone.
absl::StatusOr<dist::ClusterSpec> ClusterOfHello(const wire::HelloResponse& hello, const std::string& ps_address) {
  if (hello.cluster_text().empty()) return dist::ClusterSpec::FromHostLists(ps_address, "127.0.0.1:1");
  std::string ps_hosts, worker_hosts;
  for (absl::string_view part : absl::StrSplit(hello.cluster_text(), ';')) {
    if (absl::ConsumePrefix(&part, "ps=")) ps_hosts = std::string(part);
    if (absl::ConsumePrefix(&part, "worker=")) worker_hosts = std::string(part);
  }
  return dist::ClusterSpec::FromHostLists(ps_hosts, worker_hosts);
}

// Asks the ps at `ps_address` (waiting up to 30 s for it) who it is.
absl::StatusOr<PsTarget> ProbePs(const std::string& ps_address) {
  absl::StatusOr<std::unique_ptr<ClientChannel>> channel =
      MakeGrpcChannel(ps_address, absl::StrCat("ps ", ps_address), TransportOptions{});
  if (!channel.ok()) return channel.status();
  wire::HelloRequest probe;
  probe.set_probe(true);
  probe.set_wire_protocol(ps::kWireProtocol);
  CallOptions call;
  call.timeout_secs = 30;
  call.wait_for_ready = true;
  absl::StatusOr<IncomingMessage> hello = (*channel)->CallBlocking(Method::kHello, OutgoingMessage::Of(probe), call);
  if (!hello.ok()) return hello.status();
  wire::HelloResponse response;
  if (absl::Status s = hello->ParseHeader(&response); !s.ok()) return s;
  absl::StatusOr<dist::ClusterSpec> cluster = ClusterOfHello(response, ps_address);
  if (!cluster.ok()) return cluster.status();
  PsTarget target{*cluster, -1};
  for (int k = 0; k < target.cluster.num_ps(); ++k) {
    if (target.cluster.ps()[k] == ps_address) target.ps_index = k;
  }
  if (target.ps_index < 0) target.ps_index = response.ps_task();
  return target;
}

// A client of one variable "bench/v" of n floats on the target ps, initialized from `values` with
// an SGD whose updates leave the values unchanged.
absl::StatusOr<std::unique_ptr<ps::PsClient>> BenchClient(const PsTarget& target, int64_t n,
                                                          const std::string& transport, Tensor* values) {
  dist::PlacementPlan plan;
  plan.num_ps = target.cluster.num_ps();
  plan.global_step_ps = target.ps_index;
  plan.variables = {{"bench/v", Shape{n}}};
  dist::ShardSpec shard;
  shard.variable = "bench/v";
  shard.name = "bench/v";
  shard.shape = Shape{n};
  shard.ps_task = target.ps_index;
  plan.shards = {shard};
  ps::PsClient::Options client_options;
  client_options.cluster = target.cluster;
  client_options.plan = plan;
  client_options.worker_index = 0;
  client_options.security.transport = transport;
  absl::StatusOr<std::unique_ptr<ps::PsClient>> client = ps::PsClient::Create(client_options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->Connect(); !s.ok()) return s;
  ps::TrainingConfig config;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1e-30f;  // the ps runs the update, which leaves the values unchanged
  if (absl::Status s = (*client)->Initialize({{"bench/v", values}}, config); !s.ok()) return s;
  return client;
}

struct SizeFigures {
  Measurement tcp, push, pull, rpc;
};

// TCP, push, pull and the bare call side by side in short rounds (MeasureInterleaved), so load
// from elsewhere on the machine hits all of them alike. The bare call sends the same bytes as a
// push to a method that ignores them (Stats): the transport alone, without the ps's update.
absl::StatusOr<SizeFigures> MeasureSize(TcpBaseline& tcp, ps::PsClient& client, ClientChannel& channel, int64_t size,
                                        Tensor& values, double seconds) {
  const Tensor grad(values.shape(), 1e-3f);
  std::vector<Timings> t;
  absl::Status measured = MeasureInterleaved(
      seconds,
      {[&] { return tcp.Call(size); },
       [&] {
         return client.Push({ps::Gradient{"bench/v", &grad, nullptr}}, 0).status();
       },
       [&] {
         return client.Pull({{"bench/v", &values}}).status();
       },
       [&] {
         OutgoingMessage bare = OutgoingMessage::Of(wire::StatsRequest());
         rpc::OutgoingTensor tensor;
         tensor.meta.set_name("bench/v");
         tensor.meta.add_shape(grad.size());
         tensor.data = grad.data();  // borrowed: CallBlocking returns after the transport let go of it
         tensor.num_floats = grad.size();
         bare.tensors.push_back(std::move(tensor));
         CallOptions call;
         call.timeout_secs = 60;
         return channel.CallBlocking(Method::kStats, std::move(bare), call).status();
       }},
      &t);
  if (!measured.ok()) return measured;
  return SizeFigures{t[0].Of(size), t[1].Of(size), t[2].Of(size), t[3].Of(size)};
}

// One JSON line per size. `*_ratio`: bytes per second over all calls against TCP's (a few calls
// stalled by other load on the machine weigh in fully); `*_median_ratio`: the median call's against
// TCP's median call (TCP's median time / the call's), which such stalls do not move.
void PrintFigures(std::ostream& out, int64_t size, const SizeFigures& f) {
  out << absl::StrFormat(
             "{\"size\":%d,\"push_gbps\":%.3f,\"pull_gbps\":%.3f,\"tcp_gbps\":%.3f,\"push_ratio\":%.3f,"
             "\"pull_ratio\":%.3f,\"push_latency_ms\":%.4f,\"pull_latency_ms\":%.4f,\"tcp_latency_ms\":%.4f,"
             "\"rpc_gbps\":%.3f,\"rpc_ratio\":%.3f,\"rpc_latency_ms\":%.4f,\"push_median_ratio\":%.3f,"
             "\"pull_median_ratio\":%.3f,\"rpc_median_ratio\":%.3f}",
             size, f.push.gbps, f.pull.gbps, f.tcp.gbps, f.push.gbps / f.tcp.gbps, f.pull.gbps / f.tcp.gbps,
             f.push.latency_ms, f.pull.latency_ms, f.tcp.latency_ms, f.rpc.gbps, f.rpc.gbps / f.tcp.gbps,
             f.rpc.latency_ms, f.tcp.latency_ms / f.push.latency_ms, f.tcp.latency_ms / f.pull.latency_ms,
             f.tcp.latency_ms / f.rpc.latency_ms)
      << std::endl;
}

}  // namespace

absl::Status RunTransportBench(const std::string& ps_address, std::ostream& out, const TransportBenchOptions& options) {
  if (options.sizes.empty()) return absl::InvalidArgumentError("transport bench: no sizes");
  // Fork the TCP baseline's child before this process starts gRPC's threads.
  TcpBaseline tcp;
  if (absl::Status s = tcp.Start(*std::max_element(options.sizes.begin(), options.sizes.end())); !s.ok()) {
    return s;
  }
  absl::StatusOr<PsTarget> target = ProbePs(ps_address);
  if (!target.ok()) return target.status();
  TransportOptions transport;
  transport.transport = options.transport;
  absl::StatusOr<std::unique_ptr<ClientChannel>> channel =
      rpc::MakeChannel(ps_address, absl::StrCat("ps ", ps_address), transport);
  if (!channel.ok()) return channel.status();
  for (int64_t size : options.sizes) {
    Tensor values(Shape{size / static_cast<int64_t>(sizeof(float))}, 0.5f);
    auto client = BenchClient(*target, values.size(), options.transport, &values);
    if (!client.ok()) return client.status();
    absl::StatusOr<SizeFigures> figures =
        MeasureSize(tcp, **client, **channel, size, values, options.seconds_per_measurement);
    if (!figures.ok()) return figures.status();
    if (size == options.sizes.back() && options.shutdown_ps) {
      if (absl::Status s = (*client)->Shutdown(); !s.ok()) return s;
    } else {
      (void)(*client)->Goodbye();
    }
    PrintFigures(out, size, *figures);
  }
  return absl::OkStatus();
}

namespace {

// Starts `psflow train --job_name=ps` on a free loopback port (its log on stderr, so that stdout
// carries only the JSON lines); the ps's address in *address.
absl::StatusOr<pid_t> StartBenchPs(const std::string& self_path, const std::string& transport, std::string* address) {
  const int ps_port = FreeLoopbackPort();
  const int worker_port = FreeLoopbackPort();
  if (ps_port == 0 || worker_port == 0) return absl::InternalError("no free loopback port for the bench ps");
  *address = absl::StrCat("127.0.0.1:", ps_port);
  std::vector<std::string> args = {self_path,
                                   "train",
                                   "--job_name=ps",
                                   "--task_index=0",
                                   absl::StrCat("--ps_hosts=", *address),
                                   absl::StrCat("--worker_hosts=127.0.0.1:", worker_port),
                                   absl::StrCat("--transport=", transport)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t child = 0;
  const int spawned = posix_spawn(&child, self_path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot start a ps task (", self_path, "): ", std::strerror(spawned)));
  }
  return child;
}

// The ps exits after the bench's Shutdown; it is ended here if the bench failed before that, and
// killed after 10 s.
void StopBenchPs(pid_t child, bool bench_ok) {
  if (!bench_ok) ::kill(child, SIGTERM);
  int wstatus = 0;
  for (int i = 0; i < 100 && ::waitpid(child, &wstatus, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (::waitpid(child, &wstatus, WNOHANG) == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &wstatus, 0);
  }
}

}  // namespace

absl::Status RunTransportBenchCommand(const std::string& self_path, const std::string& ps_hosts, std::ostream& out,
                                      const std::string& transport) {
  TransportBenchOptions options;
  options.transport = transport;
  if (!ps_hosts.empty()) {
    const std::vector<std::string> hosts = absl::StrSplit(ps_hosts, ',');
    return RunTransportBench(hosts[0], out, options);
  }
  std::string address;
  absl::StatusOr<pid_t> child = StartBenchPs(self_path, transport, &address);
  if (!child.ok()) return child.status();
  options.shutdown_ps = true;
  absl::Status status = RunTransportBench(address, out, options);
  StopBenchPs(*child, status.ok());
  return status;
}

}  // namespace psflow::cli
