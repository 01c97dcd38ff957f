// psflow_transport_bench: forks a ps task on a free loopback port and runs the transport benchmark
// against it (the same measurement as `psflow bench transport`, without the CLI).
// Usage: psflow_transport_bench [--transport=grpc|shm] [SIZE_BYTES...]   (default 4 KiB, 1 MiB, 16 MiB)
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "psflow/dist/cluster.h"
#include "psflow/ps/ps_server.h"
#include "rpc/transport_bench.h"
#include "rpc/tuning.h"
#include "rpc/transport_bench_internal.h"

int main(int argc, char** argv) {
  using namespace psflow;
  rpc::TuneAllocatorForLargeMessages();
  std::string transport = "grpc";
  int first_size = 1;
  if (argc > 1 && std::string_view(argv[1]).starts_with("--transport=")) {
    transport = std::string(argv[1]).substr(std::strlen("--transport="));
    first_size = 2;
  }
  const int ps_port = rpc::FreeLoopbackPort();
  const int worker_port = rpc::FreeLoopbackPort();
  const std::string address = absl::StrCat("127.0.0.1:", ps_port);
  absl::StatusOr<dist::ClusterSpec> cluster =
      dist::ClusterSpec::FromHostLists(address, absl::StrCat("127.0.0.1:", worker_port));
  if (!cluster.ok()) {
    std::cerr << cluster.status() << std::endl;
    return 1;
  }
  // Fork before this process starts any gRPC thread.
  const pid_t child = fork();
  if (child == 0) {
    ps::PsServer::Options options;
    options.listen_address = address;
    options.cluster = *cluster;
    options.security.transport = transport;
    absl::StatusOr<std::unique_ptr<ps::PsServer>> server = ps::PsServer::Start(options);
    if (!server.ok()) {
      std::cerr << server.status() << std::endl;
      _exit(1);
    }
    absl::Status s = (*server)->Wait();
    _exit(s.ok() ? 0 : 1);
  }
  rpc::TransportBenchOptions options;
  options.shutdown_ps = true;
  options.transport = transport;
  if (argc > first_size) {
    options.sizes.clear();
    for (int i = first_size; i < argc; ++i) options.sizes.push_back(std::atoll(argv[i]));
  }
  absl::Status status = rpc::RunTransportBench(address, std::cout, options);
  if (!status.ok()) {
    std::cerr << "psflow_transport_bench: " << status << std::endl;
    kill(child, SIGTERM);
  }
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  return status.ok() ? 0 : 1;
}
