// gRPC tuning, credentials, status conversion and allocator tuning.
#include "rpc/grpc_options.h"

#include "psflow/rpc/tuning.h"

#include <malloc.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "psflow/core/check.h"

namespace psflow::rpc {
namespace {

constexpr int kWindowBytes = 64 << 20;
constexpr int kMaxFrameBytes = (16 << 20) - 1;  // HTTP/2's largest frame size

template <typename Setter>
void ApplyTuning(int64_t max_message_bytes, Setter&& set) {
  CHECK(CheckMaxMessageBytes(max_message_bytes).ok()) << max_message_bytes;
  set(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, static_cast<int>(max_message_bytes));
  set(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, static_cast<int>(max_message_bytes));
  // BDP probing starts with a small window and grows it slowly; a fixed large window lets a
  // 16 MiB tensor flow without waiting for window updates.
  set(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kWindowBytes);
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
}

// "1 MiB", "2.5 MiB", or bytes below one MiB.
std::string MiB(int64_t bytes) {
  if (bytes < (1 << 20)) return absl::StrCat(bytes, " bytes");
  if (bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the TLS ", what, " file '", path, "': check the --tls_", what,
                     " path"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void TuneAllocatorForLargeMessages() {
  // glibc otherwise serves 16 MiB buffers with mmap and returns them with munmap on every free;
  // page faults on each fresh mapping then cost more than the transfer. 32 MiB is glibc's largest
  // allowed mmap threshold on 64-bit.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

grpc::ChannelArguments TunedChannelArguments(const std::string& connection_tag, int64_t max_message_bytes) {
  grpc::ChannelArguments args;
  ApplyTuning(max_message_bytes, [&args](const char* key, int value) { args.SetInt(key, value); });
  // Distinct arguments and a local subchannel pool give each tagged channel its own connection.
  args.SetString("psflow.connection", connection_tag);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Tasks start in any order: retry connecting every few hundred ms rather than gRPC's default
  // back-off, which grows to minutes and would delay a worker long after its ps came up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

void TuneServerBuilder(grpc::ServerBuilder* builder, int64_t max_message_bytes) {
  // The builder's own size settings override channel arguments: set them too.
  builder->SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder->SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  ApplyTuning(max_message_bytes, [builder](const char* key, int value) { builder->AddChannelArgument(key, value); });
  // gRPC sets SO_REUSEPORT by default, which would let a second ps silently share a busy port.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

absl::Status CheckMaxMessageBytes(int64_t max_message_bytes) {
  if (max_message_bytes > 0 && max_message_bytes <= kMaxMessageBytesLimit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("largest message size ", max_message_bytes,
                                                 " bytes is out of range: give --max_message_mb between 1 and 2047"));
}

std::optional<absl::Status> DescribeMessageTooLarge(const grpc::Status& status, const std::string& peer,
                                                    const std::string& method) {
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return std::nullopt;
  const std::string& text = status.error_message();
  const size_t at = text.find("message larger than max (");
  if (at == std::string::npos) return std::nullopt;
  // "(N vs. M)": the message's size and the limit it broke, both in bytes.
  int64_t size = 0, limit = 0;
  const std::string numbers = text.substr(at + std::strlen("message larger than max ("));
  if (std::sscanf(numbers.c_str(), "%" SCNd64 " vs. %" SCNd64, &size, &limit) != 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        peer, ": ", method, " refused: a message is over a task's size limit (", text,
        "); start every task with a larger --max_message_mb"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      peer, ": ", method, " refused: a message of ", MiB(size), " is over the ", MiB(limit),
      " limit (gRPC: ", text, "); start every task with a larger --max_message_mb"));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const SecurityOptions& security) {
  if (security.tls_ca.empty() && security.tls_cert.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  if (!security.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(security.tls_ca, "ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!security.tls_cert.empty() && !security.tls_key.empty()) {
    // Clients present the cluster's certificate too, for servers that verify clients.
    absl::StatusOr<std::string> cert = ReadPemFile(security.tls_cert, "cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(security.tls_key, "key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& security) {
  if (security.tls_cert.empty() && security.tls_key.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (security.tls_cert.empty() || security.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both --tls_cert and --tls_key on a ps task (only one was given)");
  }
  absl::StatusOr<std::string> cert = ReadPemFile(security.tls_cert, "cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(security.tls_key, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!security.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(security.tls_ca, "ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    // With a CA, clients must prove they belong to the cluster (mutual TLS).
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace psflow::rpc
