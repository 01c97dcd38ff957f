// psflow_transport_bench: forks a ps task on a free loopback port and runs the transport benchmark
// against it (the same measurement as `psflow bench transport`, without the CLI).
// Usage: psflow_transport_bench [--transport=grpc|shm] [--seconds=S] [SIZE_BYTES...]
//        (default sizes 4 KiB, 1 MiB, 16 MiB; arguments parsed by CLI11, --help lists them)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cli/transport_bench.h"
#include "cli/transport_bench_internal.h"
#include "psflow/dist/cluster.h"
#include "psflow/ps/ps_server.h"
#include "rpc/tuning.h"

int main(int argc, char** argv) {
  using namespace psflow;
  cli::TransportBenchOptions options;
  options.shutdown_ps = true;
  CLI::App app{"psflow_transport_bench: push/pull throughput and latency against a ps task it starts on loopback"};
  app.option_defaults()->always_capture_default();
  app.add_option("--transport", options.transport, "the client's and the ps's transport")
      ->check(CLI::IsMember({"grpc", "shm"}));
  app.add_option("--seconds", options.seconds_per_measurement, "repeat each measurement about this long")
      ->check(CLI::PositiveNumber);
  std::vector<int64_t> sizes;
  app.add_option("sizes", sizes, "tensor sizes in bytes (default: 4096 1048576 16777216)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 31));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "psflow_transport_bench: error: " << e.what() << " (see psflow_transport_bench --help)" << std::endl;
    return 2;
  }
  if (!sizes.empty()) options.sizes = sizes;
  const std::string transport = options.transport;
  rpc::TuneAllocatorForLargeMessages();
  const int ps_port = cli::FreeLoopbackPort();
  const int worker_port = cli::FreeLoopbackPort();
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
  absl::Status status = cli::RunTransportBench(address, std::cout, options);
  if (!status.ok()) {
    std::cerr << "psflow_transport_bench: " << status << std::endl;
    kill(child, SIGTERM);
  }
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  return status.ok() ? 0 : 1;
}
