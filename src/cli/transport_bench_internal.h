// cli/transport_bench_internal.h — helpers shared by the transport benchmark and its executable.
#ifndef PSFLOW_CLI_TRANSPORT_BENCH_INTERNAL_H_
#define PSFLOW_CLI_TRANSPORT_BENCH_INTERNAL_H_

namespace psflow::cli {

// A loopback TCP port that was free a moment ago (0 if none): bind to port 0, read it, close.
int FreeLoopbackPort();

}  // namespace psflow::cli

#endif  // PSFLOW_CLI_TRANSPORT_BENCH_INTERNAL_H_
