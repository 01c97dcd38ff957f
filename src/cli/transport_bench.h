// cli/transport_bench.h — `psflow bench transport`: push and pull throughput and latency
// against a ps task for several tensor sizes, beside raw TCP between the same two hosts, one JSON
// line per size:
//   {"size":..., "push_gbps":..., "pull_gbps":..., "tcp_gbps":..., "push_ratio":..., "pull_ratio":...,
//    "push_latency_ms":..., "pull_latency_ms":..., "tcp_latency_ms":...,
//    "rpc_gbps":..., "rpc_ratio":..., "rpc_latency_ms":...}
// (push and pull go through the ps client and the ps, which applies each push; "rpc" is the bare
// transport: the push's bytes sent to a method that ignores them, answered with a few bytes, like
// the TCP baseline's sink)
// The benchmark initializes the ps with its own variable (one per size): point it only at a ps task
// started for benchmarking. Not thread-safe with respect to other users of that ps.
// It drives the ps through its client, so it is built above the ps, not in the transport library
// (library psflow_bench_transport).
#ifndef PSFLOW_CLI_TRANSPORT_BENCH_H_
#define PSFLOW_CLI_TRANSPORT_BENCH_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace psflow::cli {

struct TransportBenchOptions {
  std::vector<int64_t> sizes = {4 << 10, 1 << 20, 16 << 20};  // bytes per tensor
  double seconds_per_measurement = 0.5;                       // repeats each measurement about this long (min 10 calls)
  bool shutdown_ps = false;        // end the ps task afterwards (it was started for the bench)
  std::string transport = "grpc";  // the client's TransportOptions::transport ("shm": shared memory)
};

// Benchmarks the ps task at `ps_address` ("host:port", running). The raw TCP baseline runs between
// this process and a forked child on 127.0.0.1 (process to process, like a co-located ps).
absl::Status RunTransportBench(const std::string& ps_address, std::ostream& out,
                               const TransportBenchOptions& options = {});

// The CLI command: benchmarks the first ps of `ps_hosts` ("h:p,..."), or, when it is empty, starts
// a ps task on a free loopback port by running `self_path train --job_name=ps ...` (the psflow
// binary), benchmarks it and ends it.
// `transport` is the client's and the started ps's --transport.
absl::Status RunTransportBenchCommand(const std::string& self_path, const std::string& ps_hosts, std::ostream& out,
                                      const std::string& transport = "grpc");

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_TRANSPORT_BENCH_H_
