// psflow/rpc/transport_options.h — how a task talks to its peers: the shared secret and TLS files
// that authenticate it, the largest message it accepts, and the transport (gRPC, or shared memory
// for co-located tasks). A plain value type, given to the ps server and the ps client; the
// transports themselves are internal (src/rpc/).
#ifndef PSFLOW_RPC_TRANSPORT_OPTIONS_H_
#define PSFLOW_RPC_TRANSPORT_OPTIONS_H_

#include <cstdint>
#include <string>

namespace psflow::rpc {

// Largest message a task sends or receives unless told otherwise (--max_message_mb's default).
inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{1024} << 20;
// gRPC counts message sizes in an int.
inline constexpr int64_t kMaxMessageBytesLimit = int64_t{2047} << 20;

// What a task accepts from its peers and how it reaches them.
struct TransportOptions {
  std::string secret;                     // shared cluster secret; empty = no token required
  std::string tls_cert, tls_key, tls_ca;  // PEM file paths; TLS when cert and key (server) or ca (client) are set
  // Messages larger than this are refused in both directions (RESOURCE_EXHAUSTED naming the limit
  // and --max_message_mb): a bound on what a peer can make this task allocate. 1..2047 MiB.
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  // "grpc", or "shm": a ps also serves, and clients of a loopback ps also use, the shared-memory
  // data plane (src/rpc/shm_transport.h), with gRPC as the fallback (--transport). Used by
  // MakeChannel / StartServer only.
  std::string transport = "grpc";
};

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_TRANSPORT_OPTIONS_H_
