// rpc/grpc_options.h — gRPC tuning, credentials and status conversion shared by the gRPC channel
// and server (the only place psflow touches grpc::Status).
#ifndef PSFLOW_RPC_GRPC_OPTIONS_H_
#define PSFLOW_RPC_GRPC_OPTIONS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/transport.h"

namespace psflow::rpc {

// Metadata key carrying the cluster secret on every call.
inline constexpr char kTokenMetadataKey[] = "psflow-token";

// Channel arguments for large tensors: messages up to `max_message_bytes` each way, a 64 MiB
// HTTP/2 window without BDP probing, large frames and reads. `connection_tag` makes channels with
// different tags use separate TCP connections.
grpc::ChannelArguments TunedChannelArguments(const std::string& connection_tag, int64_t max_message_bytes);
// The same tuning for a server (which also refuses to share its port: no SO_REUSEPORT).
void TuneServerBuilder(grpc::ServerBuilder* builder, int64_t max_message_bytes);

// InvalidArgument naming --max_message_mb unless 0 < max_message_bytes <= kMaxMessageBytesLimit.
absl::Status CheckMaxMessageBytes(int64_t max_message_bytes);

// gRPC's own text for a message over a size limit is "Received message larger than max (N vs. M)"
// or "Sent message larger than max (N vs. M)", from either end of the call. Rewrites such a
// RESOURCE_EXHAUSTED status into one naming the peer, the method, the size, the limit and
// --max_message_mb; nullopt for any other status. `message_bytes`, when given, is the size of the
// whole message, said instead of gRPC's N when gRPC refused a piece of it (a chunk,
// rpc/chunked_message.h).
std::optional<absl::Status> DescribeMessageTooLarge(const grpc::Status& status, const std::string& peer,
                                                    const std::string& method,
                                                    std::optional<int64_t> message_bytes = std::nullopt);

// Routes gRPC's own log lines (e.g. a failed TLS handshake, logged on every reconnection attempt)
// through a filter that prints each distinct line at most once a minute. Idempotent.
void InstallGrpcLogFilter();

// While alive, gRPC's log lines written by the creating thread are collected here instead of
// printed: StartGrpcServer turns gRPC's multi-line account of a failed bind into one line.
class GrpcLogCapture {
 public:
  GrpcLogCapture();
  ~GrpcLogCapture();
  GrpcLogCapture(const GrpcLogCapture&) = delete;
  GrpcLogCapture& operator=(const GrpcLogCapture&) = delete;
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::string* outer_;  // an enclosing capture on the same thread, restored on destruction
};

// Why a server could not listen, from gRPC's log of the attempt: the port is taken, the address
// is not this host's, the name does not resolve..., with what to do about it.
std::string DescribeBindFailure(const std::string& grpc_log);

// A client's TLS settings, to explain why its connections fail.
struct ClientTls {
  bool enabled = false;          // it speaks TLS (--tls_ca or --tls_cert given)
  bool has_certificate = false;  // it can prove itself to servers that require it (cert and key)
};
ClientTls ClientTlsOf(const TransportOptions& security);

// gRPC's text of a failed connection ("failed to connect to all addresses; last error: UNKNOWN:
// ipv4:...: Ssl handshake failed: ... certificate verify failed", "... Socket closed", "...
// Connection refused"), shortened, plus what to fix when the cause is recognisable: a TLS
// mismatch names the --tls_* flag, a refused connection asks whether the task runs.
std::string DescribeConnectFailure(const std::string& grpc_text, ClientTls tls);

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TransportOptions& security);
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TransportOptions& security);

// absl::Status -> grpc::Status (the canonical codes are the same numbers). The other direction is
// converted where the client channel reads a call's result (grpc_transport.cc).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Compares secrets in time independent of where they differ.
bool SecretsEqual(std::string_view a, std::string_view b);

}  // namespace psflow::rpc

#endif  // PSFLOW_RPC_GRPC_OPTIONS_H_
